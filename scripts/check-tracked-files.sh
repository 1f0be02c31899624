#!/usr/bin/env bash
# Fails if git tracks a compiled binary (ELF, Mach-O, PE, a static archive, a Python
# extension) or any file over 5 MB: build outputs belong in the build caches, and every
# clone would download them (a stale one can also be picked up in place of a fresh build).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((5 * 1024 * 1024))
bad=0
while IFS= read -r -d '' path; do
    [ -f "$path" ] || continue
    size=$(stat -c %s "$path")
    if [ "$size" -gt "$limit" ]; then
        echo "tracked file over 5 MB: $path ($size bytes); keep it out of git" >&2
        bad=1
    fi
    case "$path" in
        *.so | *.so.* | *.dylib | *.dll | *.pyd | *.a | *.o | *.rlib | *.exe)
            echo "tracked build output: $path; remove it with git rm --cached" >&2
            bad=1
            continue
            ;;
    esac
    magic=$(head -c 4 "$path" | od -An -tx1 | tr -d ' \n')
    case "$magic" in
        7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface | 4d5a*)
            echo "tracked compiled binary: $path (starts with $magic); remove it with git rm --cached" >&2
            bad=1
            ;;
    esac
done < <(git ls-files -z)
if [ "$bad" != 0 ]; then
    exit 1
fi
echo "tracked files: no compiled binary, none over 5 MB ($(git ls-files | wc -l) files)"
