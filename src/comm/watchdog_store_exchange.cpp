#include "watchdog_exchanges.hpp"

#include <cstdlib>

namespace loom::comm {

namespace {

constexpr const char* verdict_key = "loom/watchdog/verdict";

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

class store_exchange_impl final : public watchdog_exchange {
 public:
  store_exchange_impl(c10::intrusive_ptr<c10d::Store> group_store, c10::intrusive_ptr<c10d::Store> root_store, int rank)
      : group_(std::move(group_store)), root_(std::move(root_store)), own_key_(key_of(rank)) {}

  void publish(const std::string& record) override { group_->set(own_key_, bytes_of(record)); }

  // check first: a get would wait for a key that is not there.
  std::optional<std::string> record_of(int rank) override {
    const std::string key = key_of(rank);
    if (!group_->check({key})) return std::nullopt;
    return text_of(group_->get(key));
  }

  void announce(const std::string& verdict) override { root_->set(verdict_key, bytes_of(verdict)); }

  std::optional<std::string> verdict() override {
    if (!root_->check({verdict_key})) return std::nullopt;
    return text_of(root_->get(verdict_key));
  }

  [[noreturn]] void end_job(int exit_code) override { std::_Exit(exit_code); }

 private:
  static std::string key_of(int rank) { return "watchdog/record/" + std::to_string(rank); }

  c10::intrusive_ptr<c10d::Store> group_;
  c10::intrusive_ptr<c10d::Store> root_;
  std::string own_key_;
};

}  // namespace

std::unique_ptr<watchdog_exchange> store_exchange(c10::intrusive_ptr<c10d::Store> group_store,
                                                  c10::intrusive_ptr<c10d::Store> root_store, int rank) {
  return std::make_unique<store_exchange_impl>(std::move(group_store), std::move(root_store), rank);
}

}  // namespace loom::comm
