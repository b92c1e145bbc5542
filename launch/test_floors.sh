#!/usr/bin/env bash
# Dependency floors check: installs every `name>=X` of pyproject.toml's `dependencies` at exactly X in a venv of its
# own, and runs a smoke subset of the suite there (the parts the floors were bisected for). Extra arguments go to
# pytest. Nothing here lists versions: they all come from pyproject.toml.
#
# The pin rule (decided by experiment, 2026-11-28):
#  - `dependencies`: each `name>=X` is installed as `name==X` (extras kept: `etils[epath]==1.7`). jaxlib is not
#    pinned by hand: jax X itself requires jaxlib==X, and the check below asserts jaxlib == jax.
#  - the `test` extra: only transformers is pinned at its floor (the parity tests compare against it). The rest
#    (pytest, xdist, chex, pyarrow, sentence-transformers, nbclient, nbformat, ipykernel, seqeval, triton) are test
#    tools, installed with their declared `>=` and left to float; pip still has to fit them to the pins above.
#  - where transformers' floor cannot be installed with a core floor (its own requirements, direct or through
#    huggingface-hub, exclude it), that core pin is raised to the lowest version that can be (uv's lowest-direct
#    resolution), and the run says so on a FLOOR CONFLICT line and in the summary. BERTJAX_FLOORS_STRICT=1 makes
#    such a conflict fail the run instead.
# After installing, every pin is checked against what is installed (importlib.metadata), so a pip that resolved
# anything else fails the run.
#
# The venv: ${BERTJAX_FLOORS_VENV:-~/.cache/bertjax-floors-venv}, rebuilt from scratch when the requirements read
# from pyproject.toml, the Python version, torch's version or this script change (a hash of them is kept inside).
set -euo pipefail
SCRIPT=$(realpath "$0")
cd "$(dirname "$SCRIPT")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
TORCH_PIN=torch==2.13.0  # the local CPU build; installed first, so nothing later pulls CUDA packages
VENV=${BERTJAX_FLOORS_VENV:-$HOME/.cache/bertjax-floors-venv}
PIP_LOG=$VENV.pip.log
# The smoke subset (about 2.5 minutes on 2 cores), with what each file covers of the floors:
SMOKE_FILES=(
  tests/test_robust_checkpoints.py        # orbax-checkpoint + etils: save/restore, step metadata, exact resume
  tests/test_train_resume.py              # orbax + grain: a stopped run resumes exactly
  tests/test_train_loop.py                # tensorboardX events + matplotlib loss plot, training through grain
  tests/test_metrics_writer.py            # tensorboardX writer
  tests/test_usability_remote_data.py     # etils[epath] bucket paths for data and checkpoints
  tests/test_data_pipeline.py             # grain pipelines (iterator state, close)
  tests/test_data_prepare.py              # array_record + sentencepiece/tokenizers: prepare a corpus
  tests/test_data_sources.py              # grain data sources
  tests/test_data_tokenizers.py           # sentencepiece and tokenizers training/encoding
  tests/test_hf_io.py                     # safetensors (bf16) import/export against transformers
  tests/test_hf_parity.py                 # numerical parity against transformers on torch
  tests/test_usability_tokenizer_export.py  # tokenizers/sentencepiece exported for transformers
)

t_start=$(date +%s)
req_dir=$(mktemp -d)
trap 'rm -rf "$req_dir"' EXIT

# 1. The requirements, from pyproject.toml: floors.in (core floors as `>=`, transformers pinned) for the lowest-direct
# resolution, floors.tsv (name, floor) for the checks, float.txt (the floating test tools).
"$PYTHON" - "$REPO/pyproject.toml" "$req_dir" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
out = sys.argv[2]
PINNED_TEST_TOOLS = {"transformers"}
pattern = re.compile(r"^\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")
floors, resolve_in, floating = [], [], []
def parse(req):
    m = pattern.match(req)
    if not m or m.group(4):
        sys.exit(f"test_floors.sh: cannot read requirement {req!r}")
    return m.group(1), m.group(2) or "", m.group(3)
for req in project["dependencies"]:
    name, extras, spec = parse(req)
    floor = re.fullmatch(r">=\s*([0-9][0-9A-Za-z.+!-]*)", spec)
    if spec and not floor:
        sys.exit(f"test_floors.sh: {req!r} is not a plain `>=` floor; teach this script what to do with it")
    if floor:
        floors.append((name, floor.group(1)))
    resolve_in.append(f"{name}{extras}{spec}")
for req in project["optional-dependencies"]["test"]:
    name, extras, spec = parse(req)
    if name.lower() in PINNED_TEST_TOOLS:
        floor = re.fullmatch(r">=\s*([0-9][0-9A-Za-z.+!-]*)", spec)
        if not floor:
            sys.exit(f"test_floors.sh: {req!r} must be a `>=` floor to be pinned")
        floors.append((name, floor.group(1)))
        resolve_in.append(f"{name}{extras}=={floor.group(1)}")
    else:
        floating.append(req)
open(f"{out}/floors.in", "w").write("\n".join(resolve_in) + "\n")
open(f"{out}/floors.tsv", "w").write("".join(f"{n}\t{v}\n" for n, v in floors))
open(f"{out}/float.txt", "w").write("\n".join(floating) + "\n")
EOF

key=$( { cat "$req_dir/floors.in" "$req_dir/float.txt" "$SCRIPT"; echo "$TORCH_PIN"; "$PYTHON" -VV; } | sha256sum | cut -c1-16)

# 2. The venv: reused while the key matches, else built anew.
t_install=$(date +%s)
if [[ -f "$VENV/.floors-key" && "$(cat "$VENV/.floors-key")" == "$key" ]]; then
  install_kind=warm
else
  install_kind=cold
  echo "test_floors: building $VENV (pip's output: $PIP_LOG)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  : > "$PIP_LOG"
  pip_in_venv() {
    if ! "$VENV/bin/python" -m pip "$@" >> "$PIP_LOG" 2>&1; then
      echo "test_floors: pip $* failed; the end of $PIP_LOG:" >&2
      grep -v "is ignored: it is neither a file nor a directory" "$PIP_LOG" | tail -25 >&2
      exit 1
    fi
  }
  pip_in_venv install uv  # only for the lowest-direct resolution below; everything is installed by pip
  # The lowest versions of the core requirements that install together with the pinned test tools: the floors
  # themselves, unless a pinned test tool rules one out.
  if ! "$VENV/bin/uv" pip compile "$req_dir/floors.in" --resolution lowest-direct --no-header --no-annotate -q \
      --python "$VENV/bin/python" > "$VENV/.floors-resolved" 2> "$req_dir/uv.err"; then
    echo "test_floors: the floors cannot be installed together:" >&2
    cat "$req_dir/uv.err" >&2
    exit 1
  fi
  "$PYTHON" - "$req_dir/floors.tsv" "$VENV/.floors-resolved" > "$VENV/.floors-pins" <<'EOF'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
resolved = {}
for line in open(sys.argv[2]):
    if "==" in line:
        name, version = line.split("==")
        resolved[norm(name.split("[")[0])] = version.strip()
for line in open(sys.argv[1]):
    name, floor = line.split()
    print(name, floor, resolved[norm(name)])
EOF
  pip_in_venv install "$TORCH_PIN"
  # Exact pins (a raised one where a conflict forced it), with their extras, and the floating test tools.
  mapfile -t pins < <("$PYTHON" - "$req_dir/floors.in" "$VENV/.floors-pins" <<'EOF'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
version = {norm(n): v for n, _, v in (l.split() for l in open(sys.argv[2]))}
for req in open(sys.argv[1]):
    m = re.match(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?", req.strip())
    if m:
        name = m.group(1)
        print(f"{name}{m.group(2) or ''}=={version[norm(name)]}" if norm(name) in version else req.strip())
EOF
)
  mapfile -t floating < "$req_dir/float.txt"
  pip_in_venv install "${pins[@]}" "${floating[@]}"
  pip_in_venv install --no-deps -e "$REPO"
  echo "$key" > "$VENV/.floors-key"
fi
t_installed=$(date +%s)

# The check: each pinned package installed at exactly its pin, jaxlib at jax's, torch at its pin, and bertjax from
# this checkout. A conflict-raised floor is reported, and fails the run under BERTJAX_FLOORS_STRICT=1.
raised=$("$VENV/bin/python" - "$VENV/.floors-pins" "$TORCH_PIN" "$REPO" <<'EOF'
import os, sys
from importlib.metadata import version, distribution
from pip._vendor.packaging.version import Version
bad, raised = [], []
pins = [l.split() for l in open(sys.argv[1])]
for name, floor, pin in pins:
    have = version(name.split("[")[0])
    if Version(have) != Version(pin):
        bad.append(f"{name}: installed {have}, pinned {pin}")
    if Version(pin) != Version(floor):
        raised.append(f"{name} {floor}->{pin}")
        print(f"FLOOR CONFLICT: {name}>={floor} cannot be installed with the pinned test tools; tested at {pin}",
              file=sys.stderr)
jax = next(p for n, _, p in pins if n == "jax")
if Version(version("jaxlib")) != Version(jax):
    bad.append(f"jaxlib: installed {version('jaxlib')}, jax pinned at {jax}")
torch = sys.argv[2].split("==")[1]
if Version(version("torch")).base_version != Version(torch).base_version:
    bad.append(f"torch: installed {version('torch')}, wanted {torch}")
import bertjax
if not os.path.realpath(bertjax.__file__).startswith(os.path.realpath(sys.argv[3]) + os.sep):
    bad.append(f"bertjax imported from {bertjax.__file__}, not from {sys.argv[3]}")
if bad:
    sys.exit("test_floors: installed versions differ from the pins:\n  " + "\n  ".join(bad))
print(", ".join(raised))
EOF
)
if [[ -n "$raised" && "${BERTJAX_FLOORS_STRICT:-0}" == 1 ]]; then
  echo "test_floors: failing on the floor conflicts above (BERTJAX_FLOORS_STRICT=1)" >&2
  exit 1
fi
echo "test_floors: at the floors: $(cut -d' ' -f1,3 "$VENV/.floors-pins" | tr ' ' '=' | sed 's/=/==/' | paste -sd' ')"

# 3. The smoke subset, as launch/test.sh runs the suite.
t_tests=$(date +%s)
status=0
JAX_PLATFORMS=cpu "$VENV/bin/python" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "${SMOKE_FILES[@]}" "$@" \
  || status=$?
t_end=$(date +%s)

# 4. One line.
echo "test_floors: $([[ $status == 0 ]] && echo passed || echo "FAILED (pytest exit $status)");" \
  "install $((t_installed - t_install)) s ($install_kind venv), tests $((t_end - t_tests)) s, total $((t_end - t_start)) s" \
  "${raised:+; floors raised for want of a co-installable set: $raised}"
exit "$status"
