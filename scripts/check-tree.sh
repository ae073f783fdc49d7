#!/usr/bin/env bash
# Fails, naming the file, when the repository tracks a compiled binary or a
# file over 1 MB (build outputs committed by mistake: every clone carries
# them forever), or when a main package's `go build` output is not ignored.
# Files listed in .ci/large-files-allowed (one path per line, # comments)
# may be large; binaries never.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((1024 * 1024))
allowed=()
if [ -f .ci/large-files-allowed ]; then
	mapfile -t allowed < <(grep -v '^[[:space:]]*\(#\|$\)' .ci/large-files-allowed)
fi
is_allowed() {
	local a
	for a in "${allowed[@]}"; do [ "$a" = "$1" ] && return 0; done
	return 1
}

bad=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	# ELF (Linux), Mach-O (macOS, both byte orders and fat), PE (Windows).
	case "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" in
	7f454c46 | cffaedfe | feedfacf | cafebabe | 4d5a*)
		echo "check-tree: $f is a compiled binary; git rm --cached it and ignore it in .gitignore" >&2
		bad=1
		continue
		;;
	esac
	size=$(stat -c %s "$f")
	if [ "$size" -gt "$limit" ] && ! is_allowed "$f"; then
		echo "check-tree: $f is $size bytes (over 1 MB): a build output or data file? Remove it, or list it in .ci/large-files-allowed" >&2
		bad=1
	fi
done < <(git ls-files -z)

# Every main package's binary, where go build writes it, is ignored.
for dir in $(go list -f '{{if eq .Name "main"}}{{.Dir}}{{end}}' ./...); do
	rel=${dir#"$PWD"/}
	name=$(basename "$rel")
	for out in "$rel/$name" "$name"; do
		[ -d "$out" ] && continue # a folder of that name: go build cannot write there
		if ! git check-ignore -q --no-index "$out"; then
			echo "check-tree: $out (go build of ./$rel) is not in .gitignore" >&2
			bad=1
		fi
	done
done
exit "$bad"
