// Command flame turns `perf script` output (call stacks from `perf record
// -g`) into a flame graph SVG and prints the functions with the most samples
// of their own (self time), so `make bench` can show where a server spends
// its CPU without tools that Debian does not package.
//
// Usage: perf script -i perf.data | flame -title T -o out.svg
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// node is one frame in the merged call tree.
type node struct {
	name     string
	n        int
	children map[string]*node
	order    []string
}

func (nd *node) child(name string) *node {
	if c, ok := nd.children[name]; ok {
		return c
	}
	if nd.children == nil {
		nd.children = map[string]*node{}
	}
	c := &node{name: name}
	nd.children[name] = c
	nd.order = append(nd.order, name)
	return c
}

func main() {
	title := flag.String("title", "CPU flame graph", "graph title")
	out := flag.String("o", "flame.svg", "SVG output file")
	top := flag.Int("top", 15, "functions to list by self samples")
	flag.Parse()
	root, self, incl, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flame:", err)
		os.Exit(1)
	}
	if root.n == 0 {
		fmt.Fprintln(os.Stderr, "flame: no samples in the input")
		os.Exit(1)
	}
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flame:", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(f)
	writeSVG(w, root, *title)
	if err := w.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "flame: write %s: %v\n", *out, err)
		os.Exit(1)
	}
	if err := f.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "flame: close %s: %v\n", *out, err)
		os.Exit(1)
	}
	fmt.Printf("%d samples; self time:\n", root.n)
	printTop(self, root.n, *top)
	fmt.Printf("inclusive time (the function and its callees):\n")
	printTop(incl, root.n, *top)
}

func printTop(m map[string]int, total, top int) {
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range m {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v || list[i].v == list[j].v && list[i].k < list[j].k })
	for i := 0; i < len(list) && i < top; i++ {
		fmt.Printf("  %5.1f%%  %s\n", 100*float64(list[i].v)/float64(total), list[i].k)
	}
}

// parse reads perf script's text: a header line per sample, then one frame
// per line (leaf first), then a blank line. It returns the merged tree and
// samples per function: as the leaf (self) and anywhere on the stack.
func parse(r io.Reader) (root *node, self, incl map[string]int, err error) {
	root = &node{name: "all"}
	self, incl = map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var stack []string
	flush := func() {
		if len(stack) == 0 {
			return
		}
		nd := root
		root.n++
		for i := len(stack) - 1; i >= 0; i-- {
			nd = nd.child(stack[i])
			nd.n++
		}
		self[stack[0]]++
		for i, name := range stack {
			if !slices.Contains(stack[:i], name) {
				incl[name]++
			}
		}
		stack = stack[:0]
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			flush() // a sample header
			continue
		}
		stack = append(stack, frameName(line))
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("read perf script: %w", err)
	}
	return root, self, incl, nil
}

// frameName takes "\t ffffffff81000000 do_syscall_64+0x5d ([kernel.kallsyms])"
// to "do_syscall_64".
func frameName(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return "?"
	}
	name := f[1]
	if i := strings.LastIndex(name, "+0x"); i > 0 {
		name = name[:i]
	}
	if name == "[unknown]" && len(f) > 2 {
		name += " " + f[len(f)-1]
	}
	return printable(name)
}

// printable keeps a symbol safe for XML: invalid UTF-8 and characters
// that are not printable become '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

const (
	width   = 1200.0
	rowH    = 16.0
	padTop  = 30.0
	minDraw = 1.0 // px: narrower frames are invisible and only grow the file
)

func depth(nd *node) int {
	d := 0
	for _, c := range nd.children {
		d = max(d, depth(c))
	}
	return d + 1
}

func writeSVG(w io.Writer, root *node, title string) {
	h := padTop + float64(depth(root))*rowH + 10
	fmt.Fprintf(w, `<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="%.0f" height="%.0f" xmlns="http://www.w3.org/2000/svg" font-family="monospace" font-size="11">
<rect x="0" y="0" width="100%%" height="100%%" fill="#f8f8f8"/>
<text x="%.0f" y="18" text-anchor="middle" font-size="14">%s (%d samples)</text>
`, width, h, width/2, html.EscapeString(printable(title)), root.n)
	scale := (width - 20) / float64(root.n)
	// Flame: the root at the bottom, callees above.
	var draw func(nd *node, x float64, level int)
	draw = func(nd *node, x float64, level int) {
		wd := float64(nd.n) * scale
		if wd < minDraw {
			return
		}
		y := h - 10 - float64(level+1)*rowH
		fmt.Fprintf(w, `<g><title>%s (%d samples, %.2f%%)</title><rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" rx="2"/>`,
			html.EscapeString(nd.name), nd.n, 100*float64(nd.n)/float64(root.n), x, y, wd, rowH-1, color(nd.name))
		if chars := int(wd / 7); chars >= 3 {
			label := nd.name
			if r := []rune(label); len(r) > chars {
				label = string(r[:chars-2]) + ".."
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`, x+3, y+rowH-4, html.EscapeString(label))
		}
		fmt.Fprintln(w, "</g>")
		cx := x
		for _, name := range nd.order {
			c := nd.children[name]
			draw(c, cx, level+1)
			cx += float64(c.n) * scale
		}
	}
	draw(root, 10, 0)
	fmt.Fprintln(w, "</svg>")
}

// color: kernel frames orange, Go runtime grey-blue, the rest yellow-red,
// stable per name.
func color(name string) string {
	var hsh uint32 = 2166136261
	for i := 0; i < len(name); i++ {
		hsh = (hsh ^ uint32(name[i])) * 16777619
	}
	v := int(hsh % 60)
	switch {
	case strings.HasPrefix(name, "runtime."):
		return fmt.Sprintf("rgb(%d,%d,220)", 120+v, 150+v)
	case !strings.Contains(name, "."):
		return fmt.Sprintf("rgb(230,%d,%d)", 120+v, 40+v/2)
	}
	return fmt.Sprintf("rgb(240,%d,60)", 180+v)
}
