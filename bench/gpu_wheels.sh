#!/usr/bin/env bash
# Ship this project's training stack (JAX 0.7.2 with CUDA 13, Levanter, Haliax, ...) to a GPU
# machine that has Python 3.12 and CUDA 13 libraries but no package index, in pieces small
# enough for a transfer limit. How docs/gpu.md's figures were taken; a machine with pip and
# network access needs none of this: `pip install -e '.[gpu]'`.
#
#   bench/gpu_wheels.sh pack DIR [PIECES]   here (needs pip with network access, zstd):
#       downloads cp312 manylinux wheels into DIR/whl, unpacks them into two staging trees,
#       compresses those (zstd -19) and splits the result into PIECES pieces (default 3),
#       DIR/1/part, DIR/2/part, ... ; DIR/<PIECES>/ also gets the zstandard wheel, for
#       machines without a zstd program.
#   bench/gpu_wheels.sh unpack SITE PART...   there: reassembles the parts (in order),
#       decompresses and extracts them into SITE. Then:
#           export PYTHONPATH=$PWD:SITE     (the repository first: it has its own tests/)
#
# What is carried: the versions this project's venv pins (pyproject.toml's train extra and
# what Levanter imports), where the GPU image's own differ or are missing: jax, jaxlib and
# jax-cuda13-plugin/-pjrt 0.7.2 (Levanter 1.2.dev1644 fails with jax 0.8+), transformers 4.57
# with tokenizers 0.22 and huggingface_hub 0.36 (the image has transformers 5), equinox,
# optax, chex, flax, tensorstore, ... The CUDA libraries themselves are the image's (the
# plugin loads them from its nvidia-* packages). Ray (80 MB) is not carried: an import-only
# stand-in takes its place (Levanter imports ray at module level, but training from a
# finished token cache with auto_start_cluster=False never calls it; any call raises).
set -euo pipefail

JAX_WHEELS=(jaxlib==0.7.2 jax-cuda13-plugin==0.7.2 jax-cuda13-pjrt==0.7.2)
OTHER_WHEELS=(
  jax==0.7.2 levanter==1.2.dev1644 haliax==1.4.dev453 draccus==0.11.6 jmp==0.0.4
  equinox==0.13.8 optax==0.2.8 chex==0.1.92 flax==0.12.0 jaxtyping==0.3.11 wadler_lindig==0.1.8
  ml_dtypes==0.6.0 tensorstore==0.1.86 transformers==4.57.6 tokenizers==0.22.2
  huggingface_hub==0.36.2 fsspec==2025.12.0 typing_extensions==4.16.0
  aqtp==0.9.0 async-lru==2.4.0 braceexpand==0.1.7 brotli==1.2.1 cachebox==5.2.3
  dataclasses-json==0.6.7 datasets==4.8.5 deepdiff==9.1.0 orderly-set==5.5.0 dill==0.4.1
  multiprocess==0.70.19 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3 google-api-core==2.44.0
  google-auth==2.62.2 google-cloud-core==2.8.0 google-cloud-storage==3.17.1
  google-cloud-storage-control==1.17.0 google-resumable-media==2.11.0
  googleapis-common-protos==1.76.0 grpc-google-iam-v1==0.14.6 humanfriendly==10.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  marshmallow==3.26.2 mergedeep==1.3.4 orjson==3.13.0 pydantic==2.14.3 pydantic_core==2.50.4
  pytimeparse==1.1.10 tblib==3.2.2 tqdm-loggable==0.4.1 typing-inspection==0.4.5
  zstandard==0.25.0
)
PLATFORMS=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
TARGET=(--python-version 3.12 --implementation cp --only-binary=:all: "${PLATFORMS[@]}")

ray_stub() {
  mkdir -p "$1/ray"
  cat >"$1/ray/__init__.py" <<'EOF'
"""Import-only stand-in for Ray, for a GPU bench machine that lacks Ray (see bench/gpu_wheels.sh).

Levanter imports Ray at module level (its cache builder and cluster helpers), but training
from a finished token cache with `RayConfig(auto_start_cluster=False)` never calls it. Every
`ray.*` name here is a placeholder class (usable in annotations, as a base class, in
`except`), `ray.remote` returns what it decorates, `ray.is_initialized()` is False, and the
calls that would reach a cluster raise.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STUB = True


class _Placeholder(Exception):
    def __init__(self, *args, **kwargs):
        pass


def _attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Placeholder,), {})


def _unavailable(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"ray.{name}: Ray is not installed here (import stub from bench/gpu_wheels.sh)")

    return call


def remote(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda target: target


def is_initialized():
    return False


for _name in ("get", "put", "init", "wait", "kill", "shutdown", "get_actor", "nodes", "cluster_resources"):
    globals()[_name] = _unavailable(_name)

__getattr__ = _attribute


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _attribute
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
EOF
}

pack() {
  local dir=$1 pieces=${2:-3}
  mkdir -p "$dir/whl"
  python3 -m pip download -q --no-deps "${TARGET[@]}" -d "$dir/whl" "${JAX_WHEELS[@]}" "${OTHER_WHEELS[@]}"
  rm -rf "$dir/jax" "$dir/rest" && mkdir -p "$dir/jax" "$dir/rest"
  local jax_files=() rest_files=()
  for wheel in "$dir"/whl/*.whl; do
    case $(basename "$wheel") in
      jaxlib-* | jax_cuda13_*) jax_files+=("$wheel") ;;
      *) rest_files+=("$wheel") ;;
    esac
  done
  # The large CUDA wheels in one archive, the rest in another: a change to the rest then
  # recompresses 40 MB, not 180.
  python3 -m pip install -q --no-deps --no-index --no-compile "${TARGET[@]}" --target "$dir/jax" "${jax_files[@]}"
  python3 -m pip install -q --no-deps --no-index --no-compile "${TARGET[@]}" --target "$dir/rest" "${rest_files[@]}"
  rm -rf "$dir/rest/tests" "$dir/rest/examples" "$dir/rest/bin"  # draccus ships a top-level tests/
  ray_stub "$dir/rest"
  (cd "$dir/jax" && tar cf - .) | zstd -19 --long=27 -T0 -q -f -o "$dir/jax.tar.zst"
  (cd "$dir/rest" && tar cf - .) | zstd -19 --long=27 -T0 -q -f -o "$dir/rest.tar.zst"
  rm -rf "$dir/pieces" && mkdir -p "$dir/pieces"
  cat "$dir/jax.tar.zst" "$dir/rest.tar.zst" >"$dir/pieces/all"
  split -n "$pieces" -d -a 1 "$dir/pieces/all" "$dir/pieces/part"
  rm "$dir/pieces/all"
  for i in $(seq 1 "$pieces"); do
    rm -rf "${dir:?}/$i" && mkdir -p "$dir/$i"
    mv "$dir/pieces/part$((i - 1))" "$dir/$i/part"
  done
  cp "$dir"/whl/zstandard-*.whl "$dir/$pieces/"
  du -sh "$dir"/[0-9]*
}

unpack() {
  local site=$1
  shift
  mkdir -p "$site"
  if command -v zstd >/dev/null; then
    cat "$@" | zstd -dc --long=27 | tar -xi -C "$site"
  else
    # No zstd program: the zstandard module from the wheel that travels with the last part.
    local wheel
    wheel=$(ls "$(dirname "${!#}")"/zstandard-*.whl)
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" /tmp/zstd-module
    cat "$@" | PYTHONPATH=/tmp/zstd-module python3 -c '
import sys, zstandard
reader = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(sys.stdin.buffer, read_across_frames=True)
while chunk := reader.read(1 << 20):
    sys.stdout.buffer.write(chunk)
' | tar -xi -C "$site"
  fi
  # jax-cuda13-plugin 0.7.2 has no __init__.py: as a namespace package it loses to a regular
  # one later on the path (the image's own 0.11.2), whose extension lacks what 0.7.2 calls.
  touch "$site/jax_cuda13_plugin/__init__.py"
}

case ${1:-} in
  pack) pack "${@:2}" ;;
  unpack) unpack "${@:2}" ;;
  *)
    echo "usage: $0 pack DIR [PIECES] | unpack SITE PART..." >&2
    exit 2
    ;;
esac
