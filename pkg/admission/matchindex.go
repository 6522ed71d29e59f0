package admission

import "bytes"

// locIndex finds, for a request path, the locations whose path condition
// can hold, so that Match tests those only, in file order, instead of
// every location: exact paths in a map, path prefixes in a radix tree
// walked along the path, and the locations without a path condition.
type locIndex struct {
	n     int // len(Service.Locations) when built
	exact map[string][]int32
	tree  radixNode
	rest  []int32 // no path condition
}

// radixNode is a node of the prefix tree: the path prefixes that end here
// (locs, ascending location indexes) and the edges to longer ones.
type radixNode struct {
	label string // the bytes of the edge into this node
	first []byte // first byte of each kid's label
	kids  []*radixNode
	locs  []int32
}

// maxCandidateLists bounds the lists Match merges (the exact and catch-all
// lists, and one per prefix node on the path's walk); a path with more
// matching prefix nodes falls back to the linear scan.
const maxCandidateLists = 32

// indexMinLocations is the number of locations from which Match uses the
// index; below it the linear scan is as fast.
const indexMinLocations = 16

// IndexLocations builds the index Match uses for a service with many
// locations. The loader calls it; a Service whose Locations change
// afterwards is matched by the linear scan until it is called again.
func (s *Service) IndexLocations() {
	s.index = nil
	if len(s.Locations) < indexMinLocations {
		return
	}
	x := &locIndex{n: len(s.Locations), exact: map[string][]int32{}}
	for i, l := range s.Locations {
		switch m := &l.Match; {
		case m.Path != "":
			x.exact[m.Path] = append(x.exact[m.Path], int32(i))
		case m.PathPrefix != "":
			x.tree.insert(m.PathPrefix, int32(i))
		default:
			x.rest = append(x.rest, int32(i))
		}
	}
	s.index = x
}

func (n *radixNode) insert(key string, loc int32) {
	for key != "" {
		j := bytes.IndexByte(n.first, key[0])
		if j < 0 {
			n.first = append(n.first, key[0])
			n.kids = append(n.kids, &radixNode{label: key, locs: []int32{loc}})
			return
		}
		c := n.kids[j]
		p := 0
		for p < len(c.label) && p < len(key) && c.label[p] == key[p] {
			p++
		}
		if p < len(c.label) { // split the edge at p
			mid := &radixNode{label: c.label[:p], first: []byte{c.label[p]}, kids: []*radixNode{c}}
			c.label = c.label[p:]
			n.kids[j] = mid
			c = mid
		}
		n, key = c, key[p:]
	}
	n.locs = append(n.locs, loc)
}

// match is Service.Match through the index: the first location in file
// order among those whose path condition holds. ok is false when the
// path has more candidate lists than it merges.
func (x *locIndex) match(locs []*Location, r *Request) (l *Location, ok bool) {
	var lists [maxCandidateLists][]int32
	k := 0
	add := func(c []int32) bool {
		if len(c) == 0 {
			return true
		}
		if k == len(lists) {
			return false
		}
		lists[k] = c
		k++
		return true
	}
	add(x.rest)
	add(x.exact[string(r.Path)])
	n, p := &x.tree, r.Path
	for len(p) > 0 {
		j := bytes.IndexByte(n.first, p[0])
		if j < 0 {
			break
		}
		c := n.kids[j]
		if len(p) < len(c.label) || string(p[:len(c.label)]) != c.label {
			break
		}
		n, p = c, p[len(c.label):]
		if !add(n.locs) {
			return nil, false
		}
	}
	for {
		best := -1
		for j := 0; j < k; j++ {
			if len(lists[j]) > 0 && (best < 0 || lists[j][0] < lists[best][0]) {
				best = j
			}
		}
		if best < 0 {
			return nil, true
		}
		i := lists[best][0]
		lists[best] = lists[best][1:]
		if l := locs[i]; l.Match.matches(r) {
			return l, true
		}
	}
}
