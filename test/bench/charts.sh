#!/usr/bin/env bash
# Draws the side-by-side benchmark results (`make bench`) as SVG charts with
# gnuplot (Debian package gnuplot-nox):
#   DIR/sidebyside-throughput.svg  req/s per setup
#   DIR/sidebyside-cpu.svg         server CPU µs per request per setup
#   DIR/sidebyside-latency.svg     p50 and p99 latency per setup (log scale)
# Input: the results file test/bench/run.sh writes (tab-separated, one
# header line): row, setup, req_s, p50_ms, p99_ms, cpu_us_per_req; a value
# that was not measured is NA.
#
# Usage: test/bench/charts.sh [RESULTS.tsv] [DIR]
#        (defaults: docs/bench/sidebyside.tsv docs/bench)
#        test/bench/charts.sh --from-md REPORT.md [DIR]
#        first rebuilds REPORT.tsv from the report's main table (columns
#        found by their headings; a run without "CPU µs/req" gets NA), for
#        a report written without its .tsv.
set -euo pipefail
if [ "${1:-}" = --from-md ]; then
  md=${2:?--from-md needs the report}
  RESULTS=${md%.md}.tsv
  awk -F' [|] ' -v OFS='\t' '
    /^[|] setup [|]/ && !hdr {
      hdr = 1; sub(/^[|] /, ""); sub(/ [|]$/, "")
      n = split($0, h, / [|] /)
      for (i = 1; i <= n; i++) {
        if (h[i] == "setup") cs = i
        else if (h[i] ~ /^req\/s/ && !cr) cr = i
        else if (h[i] == "p50 ms") c5 = i
        else if (h[i] == "p99 ms") c9 = i
        else if (h[i] == "CPU µs/req") cc = i
      }
      print "row", "setup", "req_s", "p50_ms", "p99_ms", "cpu_us_per_req"; next
    }
    hdr == 1 && /^[|]---/ { next }
    hdr == 1 && /^[|] / {
      line = $0; sub(/^[|] /, "", line); sub(/ [|]$/, "", line); split(line, f, / [|] /)
      print "row" ++r, f[cs], f[cr], f[c5], f[c9], (cc ? f[cc] : "NA"); next
    }
    hdr == 1 { hdr = 2 }' "$md" >"$RESULTS"
  shift 2
  set -- "$RESULTS" "${1:-$(dirname "$md")}"
fi
RESULTS=${1:-docs/bench/sidebyside.tsv}
DIR=${2:-docs/bench}
command -v gnuplot >/dev/null || { echo "charts.sh: needs gnuplot (Debian package gnuplot-nox; make deps installs it)" >&2; exit 1; }
[ -s "$RESULTS" ] || { echo "charts.sh: $RESULTS missing or empty" >&2; exit 1; }
header=$(head -n1 "$RESULTS")
[ "$header" = "$(printf 'row\tsetup\treq_s\tp50_ms\tp99_ms\tcpu_us_per_req')" ] ||
  { echo "charts.sh: $RESULTS: unexpected header: $header" >&2; exit 1; }
rows=$(($(wc -l <"$RESULTS") - 1))
[ "$rows" -gt 0 ] || { echo "charts.sh: $RESULTS has no rows" >&2; exit 1; }
mkdir -p "$DIR"

# Bars are horizontal, one per setup, top to bottom in the file's order;
# the setup description is the y tic label.
data=$(mktemp /tmp/rl-charts.XXXXXX)
trap 'rm -f "$data"' EXIT
awk -F'\t' -v OFS='\t' -v n="$rows" 'NR > 1 { print n - (NR - 2), $2, $3, $4, $5, $6 }' "$RESULTS" >"$data"
height=$((170 + 34 * rows))
# A metric that was measured for no setup gets a note instead of bars.
measured() { awk -F'\t' -v c="$1" '$c != "NA" && $c != "" {found = 1} END {exit !found}' "$data"; }
# The run's date and command, from the Markdown report beside the results.
report=${RESULTS%.tsv}.md
run_note="make bench (test/bench/run.sh)"
if [ -f "$report" ]; then
  when=$(sed -n 's/^- date: //p' "$report" | head -n1)
  [ -n "$when" ] && run_note="$run_note, $when; details in $(basename "$report")"
fi

common="
set encoding utf8
set terminal svg size 960,$height dynamic enhanced font 'sans,12' background '#ffffff'
set datafile separator '\t'
set datafile missing 'NA'
set style fill solid 0.85 border -1
set grid xtics lc rgb '#dddddd'
set border 3
set xtics nomirror
set ytics nomirror scale 0 noenhanced
set yrange [0.3:$rows + 0.7]
set key below horizontal
set lmargin 62
set label 99 '$run_note' at screen 0.01, screen 0.97 left font ',10' tc rgb '#666666'
"

chart() { # file, title, xlabel, metric column, colour, format
  local file=$1 title=$2 xlabel=$3 col=$4 colour=$5 fmt=$6
  if measured "$col"; then
    gnuplot <<EOF
$common
set output '$DIR/$file'
set title "$title"
set xlabel "$xlabel"
set xrange [0:*]
set offsets 0, graph 0.12, 0, 0
plot '$data' using (\$$col/2):1:(\$$col/2):(0.35):ytic(2) with boxxyerror lc rgb '$colour' notitle, \
     '' using $col:1:(sprintf('$fmt', \$$col)) with labels left offset 0.5,0 notitle
EOF
  else
    gnuplot <<EOF
$common
set output '$DIR/$file'
set title "$title"
set xlabel "$xlabel"
set xrange [0:1]
unset xtics
set label 1 "not measured in this run" at graph 0.5, graph 0.5 center
plot '$data' using (0):1:ytic(2) with points pt -1 notitle
EOF
  fi
  echo "wrote $DIR/$file"
}

chart sidebyside-throughput.svg "Throughput (req/s, higher is better)" "requests per second" 3 '#4477aa' '%.0f'
chart sidebyside-cpu.svg "Server CPU per request (µs, lower is better)" "CPU µs per request (server processes, user + system)" 6 '#cc6677' '%.1f'

# Latency: p50 and p99 side by side per setup, log scale.
gnuplot <<EOF
$common
set output '$DIR/sidebyside-latency.svg'
set title "Latency percentiles (ms, log scale, lower is better)"
set xlabel "milliseconds (wrk --latency, the median-throughput round)"
set logscale x 10
set xrange [0.05:*]
set offsets 0, graph 0.15, 0, 0
plot '$data' using (sqrt(0.05*\$4)):(\$1+0.18):(0.05):(\$4):(\$1):(\$1+0.36):ytic(2) with boxxy lc rgb '#44aa99' title 'p50', \
     '' using (sqrt(0.05*\$5)):(\$1-0.18):(0.05):(\$5):(\$1-0.36):(\$1) with boxxy lc rgb '#aa4499' title 'p99', \
     '' using 4:(\$1+0.18):(sprintf('%.2f', \$4)) with labels left offset 0.5,0 font ',10' notitle, \
     '' using 5:(\$1-0.18):(sprintf('%.2f', \$5)) with labels left offset 0.5,0 font ',10' notitle
EOF
echo "wrote $DIR/sidebyside-latency.svg"
