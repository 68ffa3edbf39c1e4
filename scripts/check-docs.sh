#!/usr/bin/env bash
# Checks the relative links of README.md and docs/: each must name a file or directory
# of the repository, and a `#anchor` must name a heading of the Markdown file it points
# into (GitHub's anchors: the heading lowercased, ASCII punctuation but '-' and '_'
# dropped, spaces made '-', a repeated one numbered -1, -2, ...). Links inside code
# (fenced blocks, `spans`) and links with a scheme (https:, mailto:) are not checked.
# usage: scripts/check-docs.sh [FILE.md...]   (default: README.md and docs/**/*.md)
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
export LC_ALL=C

if (($#)); then
    files=("$@")
else
    files=(README.md)
    if [[ -d docs ]]; then
        while IFS= read -r f; do files+=("$f"); done < <(find docs -name '*.md' | sort)
    fi
fi
# Every Markdown file of the repository may be pointed into, not only those checked.
targets=()
while IFS= read -r f; do targets+=("$f"); done < <(find . -name '*.md' -not -path './target/*' -not -path './.git/*' | sed 's|^\./||' | sort)

# "FILE#anchor" for each heading of each Markdown file.
anchors=$(awk '
    FNR == 1 { fence = 0; delete seen }
    /^```/ { fence = !fence; next }
    fence { next }
    /^##?#?#?#?#? / {
        h = $0
        sub(/^#+ +/, "", h)
        sub(/ +$/, "", h)
        h = tolower(h)
        gsub(/[!-,.\/:-@[-^`{-~]/, "", h)
        gsub(/ /, "-", h)
        n = seen[h]++
        print FILENAME "#" (n ? h "-" n : h)
    }
' "${targets[@]}")

# FILE<TAB>LINE<TAB>TARGET for each link outside code.
links=$(awk '
    FNR == 1 { fence = 0 }
    /^```/ { fence = !fence; next }
    fence { next }
    {
        line = $0
        gsub(/`[^`]*`/, "", line)
        while (match(line, /\]\([^) ]+\)/)) {
            print FILENAME "\t" FNR "\t" substr(line, RSTART + 2, RLENGTH - 3)
            line = substr(line, RSTART + RLENGTH)
        }
    }
' "${files[@]}")

broken=0
checked=0
while IFS=$'\t' read -r file line target; do
    [[ -n "$file" ]] || continue
    case "$target" in
        [a-zA-Z]*:*) continue ;; # https:, mailto:, ...
    esac
    checked=$((checked + 1))
    path=${target%%#*}
    anchor=
    [[ "$target" == *"#"* ]] && anchor=${target#*#}
    if [[ -z "$path" ]]; then
        dest=$file
    else
        dest=$(realpath -m --relative-to=. "$(dirname "$file")/$path")
    fi
    if [[ ! -e "$dest" ]]; then
        echo "$file:$line: $target: no such file or directory ($dest)" >&2
        broken=$((broken + 1))
    elif [[ -n "$anchor" && "$dest" == *.md ]] && ! grep -Fxq -- "$dest#$anchor" <<<"$anchors"; then
        echo "$file:$line: $target: $dest has no heading whose anchor is #$anchor" >&2
        broken=$((broken + 1))
    fi
done <<<"$links"

if ((broken)); then
    echo "check-docs.sh: $broken of $checked relative links lead nowhere" >&2
    exit 1
fi
echo "check-docs.sh: all $checked relative links of ${#files[@]} files lead somewhere"
