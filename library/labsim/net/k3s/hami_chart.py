"""HAMi's chart rendered with role hami's default values, for the k3s stand-in: the data file
``data/hami-chart.json`` of this package, made by scripts/render_hami_chart.py (do not edit it; render again).

CHARTS maps a chart version to its rendering: source (chart, tag, commit), renderer and its version, the
Kubernetes version the chart saw, release and namespace, the values and their SHA-256, and every manifest by
template path (a list of documents). The file's ``_provenance`` repeats what made it, per chart. It is read
with pkgutil, so it loads as package data both from the source tree and from the k3s binary (a zipapp, see
:func:`labsim.net.k3s.build_zipapp`).
"""

import json
import pkgutil

#: the data file, relative to this package
FIXTURE = "data/hami-chart.json"

CHARTS = json.loads(pkgutil.get_data(__package__, FIXTURE))["charts"]
