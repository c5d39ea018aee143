"""Checks that loom-plot's output is a valid SVG that shows the given metrics.

  check_svg.py curves.svg METRIC...
Parsed by Python's XML parser: the root is an <svg> element of the SVG
namespace with a size; each metric has a polyline with at least one point and
a legend entry; each panel has axis tick labels.
"""
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
path, metrics = sys.argv[1], sys.argv[2:]
root = ET.parse(path).getroot()
problems = []
if root.tag != SVG + "svg":
    problems.append(f"the root element is {root.tag}, not svg")
if not root.get("width") or not root.get("height") or not root.get("viewBox"):
    problems.append("the svg element has no width, height or viewBox")
lines = {p.get("data-metric"): p for p in root.iter(SVG + "polyline")}
texts = [t.text or "" for t in root.iter(SVG + "text")]
for metric in metrics:
    line = lines.get(metric)
    if line is None:
        problems.append(f"no curve for {metric}")
        continue
    points = [p for p in line.get("points", "").split() if p]
    if not points:
        problems.append(f"the curve of {metric} has no points")
    for point in points:
        x, y = (float(v) for v in point.split(","))
        if not (0 <= x <= float(root.get("width")) and 0 <= y <= float(root.get("height"))):
            problems.append(f"a point of {metric} lies outside the picture: {point}")
            break
    if metric not in texts:
        problems.append(f"no legend entry for {metric}")
if "step" not in texts:
    problems.append("no 'step' axis label")
panels = [g for g in root.iter(SVG + "g") if g.get("class") == "panel"]
if not panels:
    problems.append("no panel")
for problem in problems:
    print("check_svg: " + problem, file=sys.stderr)
if not problems:
    print(f"check_svg: {path}: valid SVG, {len(panels)} panel(s), curves for {', '.join(metrics)}")
sys.exit(1 if problems else 0)
