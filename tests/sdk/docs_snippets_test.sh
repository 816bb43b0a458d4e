#!/usr/bin/env bash
# The documentation's examples work. In README.md and docs/*.md:
#   - every complete pipeline (a ```pbtxt block) passes `engine check`; fragments of a pipeline go
#     in ```protobuf or ```text blocks, which are not checked;
#   - every line of a code block that runs the engine (`engine ...`, `build/bin/engine ...`, any
#     path ending in /engine) names a command `engine help` lists, and each --flag on it is one
#     that `engine help COMMAND` describes.
# A pipeline block is checked as a file beside the shipped ones in pipelines/: its relative paths
# (../data/..., qwen2_vl_tiny/...) resolve as theirs do. Fails naming the file, the block or line,
# and engine check's errors.
#   docs_snippets_test.sh ENGINE_BINARY SOURCE_DIR
set -euo pipefail
engine=$(realpath "$1")
root=$(realpath "$2")
cd "$root"
docs=(README.md docs/*.md)

commands=$("$engine" help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }' |
  sort -u)
if [ -z "$commands" ]; then
  echo "'$engine help' listed no command" >&2
  exit 1
fi

# At the repository's top level, like pipelines/, with links to what pipelines/ holds beside its
# pipeline files; removed however the script ends.
tmp=$(mktemp -d "$root/.docs_snippets.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for entry in "$root"/pipelines/*; do
  case $entry in *.pbtxt) continue ;; esac
  ln -s "$entry" "$tmp/"
done

# One line per pipeline block ("P<TAB>doc<TAB>block<TAB>line<TAB>file", the block written to file)
# and per engine command in a code block ("C<TAB>doc<TAB>line<TAB>command", continued lines joined).
list_snippets() {
  awk -v tmp="$tmp" '
    FNR == 1 { fence = 0; blocks = 0; stem = FILENAME; gsub(/[^A-Za-z0-9]+/, "_", stem);
               sub(/_md$/, "", stem) }
    /^[ \t]*```/ {
      if (!fence) {
        fence = 1; lang = $0; sub(/^[ \t]*```[ \t]*/, "", lang); sub(/[ \t].*/, "", lang)
        out = ""
        if (lang == "pbtxt") {
          out = sprintf("%s/%s_%d.pbtxt", tmp, stem, ++blocks)
          printf "P\t%s\t%d\t%d\t%s\n", FILENAME, blocks, FNR, out
          printf "" > out
        }
      } else {
        fence = 0
        if (out != "") close(out)
      }
      pending = ""
      next
    }
    !fence { next }
    {
      if (out != "") print > out
      line = $0
      if (pending != "") { line = pending " " line; pending = "" }
      else if (line ~ /^[ \t]*([^ \t]*\/)?engine[ \t]+/) start = FNR
      else next
      if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); pending = line; next }
      printf "C\t%s\t%d\t%s\n", FILENAME, start, line
    }
  ' "${docs[@]}"
}

declare -A help_text
status=0
pipelines=0
engine_lines=0
while IFS=$'\t' read -r kind doc a b c; do
  if [ "$kind" = P ]; then
    block=$a line=$b file=$c
    pipelines=$((pipelines + 1))
    if ! errors=$("$engine" check "$file" 2>&1 >/dev/null); then
      echo "$doc: pipeline block $block (the \`\`\`pbtxt at line $line) fails engine check; the" \
        "block's line 1 is line $((line + 1)) of $doc:" >&2
      echo "$errors" >&2
      status=1
    fi
    continue
  fi
  line=$a text=$b
  engine_lines=$((engine_lines + 1))
  text=${text%%[[:space:]]#*}    # a comment
  read -ra words <<<"$text"
  text=${words[*]}
  command=${words[1]:-}
  if ! grep -qxF -- "$command" <<<"$commands"; then
    echo "$doc:$line: '$command' is not an engine command (engine help lists:" \
      "$(paste -sd ' ' <<<"$commands")): $text" >&2
    status=1
    continue
  fi
  [ "$command" = help ] && continue
  if [ -z "${help_text[$command]+set}" ]; then
    help_text[$command]=$("$engine" help "$command")
  fi
  while read -r flag; do
    case $flag in --help | --verbose | --version) continue ;; esac
    if ! grep -qE -- "${flag}([^a-z0-9_-]|\$)" <<<"${help_text[$command]}"; then
      echo "$doc:$line: '$flag' is not a flag of 'engine $command' (engine help $command): $text" >&2
      status=1
    fi
  done < <(grep -oE '(^|[[:space:]([|])--[a-z][a-z0-9_-]*' <<<"$text" | sed 's/^[^-]*//')
done < <(list_snippets)

if [ "$pipelines" -eq 0 ] || [ "$engine_lines" -eq 0 ]; then
  echo "found $pipelines pipeline blocks and $engine_lines engine commands in ${docs[*]}" >&2
  exit 1
fi
if [ "$status" -eq 0 ]; then
  echo "$pipelines pipeline blocks pass engine check; $engine_lines engine commands exist"
fi
exit $status
