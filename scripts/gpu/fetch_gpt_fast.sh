#!/usr/bin/env bash
# Puts gpt-fast's model.py and generate.py (and its licence) into .thirdparty/gpt-fast/,
# at the commit the course pins, for scripts/gpu/compare_decode.py to import. gpt-fast's
# code is never committed here: .thirdparty/ is in .gitignore.
#
#     bash scripts/gpu/fetch_gpt_fast.sh                      # clones from GitHub
#     bash scripts/gpu/fetch_gpt_fast.sh /path/to/gpt-fast    # a local clone or bare mirror
#     bash scripts/gpu/fetch_gpt_fast.sh SOURCE DEST          # another destination
#
# The commit is the one the book's deep dives cite (pytorch-labs/gpt-fast 32971d3); it is
# written to DEST/COMMIT, which compare_decode.py copies into its results file.
# A machine that cannot reach GitHub: run this where a clone is, and carry the folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=32971d3129541c5bfb4f715abc33d1c5f408d204
SOURCE="${1:-https://github.com/pytorch-labs/gpt-fast.git}"
DEST="${2:-.thirdparty/gpt-fast}"
FILES=(model.py generate.py LICENSE)

if [ -d "$SOURCE" ]; then
  repo="$SOURCE"
else
  repo="$(mktemp -d)"
  trap 'rm -rf "$repo"' EXIT
  git clone --quiet --no-checkout "$SOURCE" "$repo"
fi
if ! git -C "$repo" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  echo "$SOURCE does not hold gpt-fast's commit $COMMIT (fetch it there first)" >&2
  exit 1
fi
mkdir -p "$DEST"
for file in "${FILES[@]}"; do
  git -C "$repo" show "$COMMIT:$file" > "$DEST/$file"
done
printf '%s pytorch-labs/gpt-fast (from %s)\n' "$COMMIT" "$SOURCE" > "$DEST/COMMIT"
echo "gpt-fast $COMMIT: ${FILES[*]} in $DEST/"
