package admission

import (
	"math"
	"strings"

	"gopkg.in/yaml.v3"
)

func (l *loader) zones(n *yaml.Node) {
	if l.alias(n, "zones") {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "zones: want a mapping of zone names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := l.name(k, "zones")
		if !ok {
			continue
		}
		ctx := "zones." + name
		if _, dup := l.p.zoneByName[name]; dup {
			l.errorf(k, "%s: duplicate zone", ctx)
			continue
		}
		pairs, ok := l.mapping(v, ctx, "bucket", "rate", "burst", "cost", "invalid")
		if !ok {
			continue
		}
		z := &Zone{Name: name, Cost: 1, Line: k.Line}
		good := true
		var costNode *yaml.Node
		for _, e := range pairs {
			c := ctx + "." + e.key
			switch e.key {
			case "bucket":
				z.Bucket = l.template(e.v, c, MaxBucketLen, true)
				good = good && z.Bucket != nil
				if z.Bucket != nil && strings.HasPrefix(z.Bucket.literalPrefix(), ShadowBucketPrefix) {
					l.errorf(e.v, "%s: must not start with %q (the namespace of shadow-mode checks)", c, ShadowBucketPrefix)
					good = false
				}
			case "rate":
				if tv, isTier, ok := l.tierRef(e.v, c, numRate); isTier {
					z.RateTier, good = tv, good && ok
					continue
				}
				r, p, ok := l.rate(e.v, c)
				z.Rate, z.PeriodMs, good = r, p, good && ok
			case "burst":
				if tv, isTier, ok := l.tierRef(e.v, c, numBurst); isTier {
					z.BurstTier, good = tv, good && ok
					continue
				}
				b, ok := l.integer(e.v, c, 0, math.MaxUint32)
				z.Burst, good = uint32(b), good && ok
			case "invalid":
				z.Invalid = l.invalid(e.v, c)
			case "cost":
				costNode = e.v
				if tv, isTier, ok := l.tierRef(e.v, c, numCost); isTier {
					z.Cost, z.CostTier, good = 0, tv, good && ok
					continue
				}
				b, ok := l.integer(e.v, c, 1, math.MaxUint32)
				z.Cost, good = uint32(b), good && ok
			}
		}
		if z.Bucket == nil && !hasKey(pairs, "bucket") {
			l.errorf(v, "%s: missing bucket", ctx)
			good = false
		}
		if z.Rate == 0 && z.RateTier == nil && !hasKey(pairs, "rate") {
			l.errorf(v, "%s: missing rate", ctx)
			good = false
		}
		if good {
			if costNode == nil {
				costNode = v
			}
			l.checkCapacity(z, costNode, ctx)
		}
		l.p.zoneByName[name] = z
		l.p.Zones = append(l.p.Zones, z)
	}
}

func (l *loader) trackers(n *yaml.Node) {
	if l.alias(n, "trackers") {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "trackers: want a mapping of tracker names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := l.name(k, "trackers")
		if !ok {
			continue
		}
		ctx := "trackers." + name
		if _, dup := l.p.trackerByName[name]; dup {
			l.errorf(k, "%s: duplicate tracker", ctx)
			continue
		}
		pairs, ok := l.mapping(v, ctx, "service", "invalid")
		if !ok {
			continue
		}
		t := &Tracker{Name: name, Line: k.Line}
		for _, e := range pairs {
			switch e.key {
			case "service":
				t.Service = l.template(e.v, ctx+".service", MaxBucketLen, true)
			case "invalid":
				t.Invalid = l.invalid(e.v, ctx+".invalid")
			}
		}
		if !hasKey(pairs, "service") {
			l.errorf(v, "%s: missing service", ctx)
		}
		l.p.trackerByName[name] = t
		l.p.Trackers = append(l.p.Trackers, t)
	}
}

func hasKey(pairs []kv, key string) bool {
	for _, e := range pairs {
		if e.key == key {
			return true
		}
	}
	return false
}

// template compiles a template and applies the static limits: the literal
// part alone must fit max, and a required value must not be statically
// empty.
func (l *loader) template(v *yaml.Node, ctx string, max int, nonEmpty bool) *Template {
	s, ok := l.str(v, ctx)
	if !ok {
		return nil
	}
	t, err := CompileTemplate(s)
	if err != nil {
		l.errorf(v, "%s: %v", ctx, err)
		return nil
	}
	t.max, t.nonEmpty = max, nonEmpty
	switch {
	case t.StaticLen() > max && t.Static():
		l.errorf(v, "%s: static value is %d bytes, over the %d-byte limit", ctx, t.StaticLen(), max)
		return nil
	case t.StaticLen() > max:
		l.errorf(v, "%s: literal text is %d bytes, over the %d-byte limit before any variable", ctx, t.StaticLen(), max)
		return nil
	case nonEmpty && t.Static() && t.StaticLen() == 0:
		l.errorf(v, "%s: must not be empty", ctx)
		return nil
	}
	return t
}
