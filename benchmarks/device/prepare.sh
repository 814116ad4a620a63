#!/bin/bash
# Builds .gpu/ (git ignores it) for a call of the device tool, which carries
# 64 MiB at most and has torch, transformers and sentence-transformers but no Ray, pydantic or datasets:
# MiniLM as bf16 (45 MB; upcast.py makes fp32 there), MPNet without its weights (220 MB even in bf16: upcast.py
# draws them there from its config, for speed only), STS-B, and pydantic's and datasets' wheels for Python 3.12.
# Run from the repository root with the project's virtual environment:
#   bash benchmarks/device/prepare.sh ../shared/data
# then call the device tool with command "bash benchmarks/device/run.sh" and carry [".gpu"].
set -euo pipefail
data=${1:?the data folder, e.g. ../shared/data}
py=${PYTHON:-.venv/bin/python}
rm -rf .gpu && mkdir -p .gpu/whl .gpu/data
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing_extensions==4.16.0
cp -r "$data/stsb" .gpu/data/
where='from trainables.models.files import resolve_model_path as r; import sys; print(r(sys.argv[1]))'
$py benchmarks/device/upcast.py --down "$($py -c "$where" sentence-transformers/all-MiniLM-L6-v2)" .gpu/minilm
# MPNet's folder comes from `make .venv/bin/.mpnet` (or the hub, online); without it run.sh skips MPNet
if mpnet=$($py -c "$where" sentence-transformers/all-mpnet-base-v2 2>/dev/null); then
  $py benchmarks/device/upcast.py --bare "$mpnet" .gpu/mpnet
fi
du -sh .gpu
