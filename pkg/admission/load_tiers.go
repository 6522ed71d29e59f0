package admission

import (
	"math"
	"time"

	"gopkg.in/yaml.v3"
)

// numKind is the kind of number a tier supplies.
type numKind uint8

const (
	numRate numKind = iota
	numBurst
	numCost
	numThreshold
)

// rawTier is a tier as written: its entries are parsed per use, since a
// tier's values are rates for a rate and integers for a burst.
type rawTier struct {
	tier *Tier
	vals []kv // key = entry key
	def  *yaml.Node
}

type tierUse struct {
	name string
	kind numKind
}

// tiers parses the top-level tiers block: NAME: {key: TEMPLATE, values:
// {KEY: VALUE, ...}, default: VALUE}.
func (l *loader) tiers(n *yaml.Node) {
	if l.alias(n, "tiers") {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(n, "tiers: want a mapping of tier names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, ok := l.name(k, "tiers")
		if !ok {
			continue
		}
		ctx := "tiers." + name
		if _, dup := l.tierRaw[name]; dup {
			l.errorf(k, "%s: duplicate tier", ctx)
			continue
		}
		pairs, ok := l.mapping(v, ctx, "key", "values", "default")
		if !ok {
			continue
		}
		rt := &rawTier{tier: &Tier{Name: name, Line: k.Line}}
		for _, e := range pairs {
			switch e.key {
			case "key":
				rt.tier.Key = l.template(e.v, ctx+".key", MaxTierKeyLen, false)
			case "values":
				rt.vals = l.tierValues(e.v, ctx+".values")
				for _, kv := range rt.vals {
					rt.tier.Keys = append(rt.tier.Keys, kv.key)
				}
			case "default":
				rt.def = e.v
			}
		}
		if !hasKey(pairs, "key") {
			l.errorf(v, "%s: missing key (a template such as \"{header.x-plan}\")", ctx)
		}
		if !hasKey(pairs, "values") {
			l.errorf(v, "%s: missing values", ctx)
		}
		l.tierRaw[name] = rt
		l.p.tierByName[name] = rt.tier
		l.p.Tiers = append(l.p.Tiers, rt.tier)
	}
}

// tierValues reads the entries of a tier (any string keys, unique).
func (l *loader) tierValues(n *yaml.Node, ctx string) []kv {
	if l.alias(n, ctx) {
		return nil
	}
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		l.errorf(n, "%s: want a non-empty mapping of key: value, got %s", ctx, kindName(n))
		return nil
	}
	var out []kv
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			l.errorf(k, "%s: keys must be plain strings", ctx)
			continue
		}
		if len(k.Value) > MaxTierKeyLen {
			l.errorf(k, "%s: key is %d bytes, over the %d-byte limit", ctx, len(k.Value), MaxTierKeyLen)
			continue
		}
		if seen[k.Value] {
			l.errorf(k, "%s: duplicate key %q", ctx, short(k.Value))
			continue
		}
		seen[k.Value] = true
		out = append(out, kv{key: k.Value, k: k, v: v})
	}
	return out
}

// tierRef recognises `{tier: NAME}` in place of a number. isTier is false
// for anything else (the caller parses the literal). The values are parsed
// as kind once per (tier, kind); errors name the field that uses them.
func (l *loader) tierRef(v *yaml.Node, ctx string, kind numKind) (tv *TierValue, isTier, ok bool) {
	if v.Kind != yaml.MappingNode {
		return nil, false, false
	}
	pairs, ok := l.mapping(v, ctx, "tier")
	if !ok || len(pairs) == 0 {
		if ok {
			l.errorf(v, "%s: want {tier: NAME}", ctx)
		}
		return nil, true, false
	}
	name, ok := l.str(pairs[0].v, ctx+".tier")
	if !ok {
		return nil, true, false
	}
	rt := l.tierRaw[name]
	if rt == nil {
		l.errorf(pairs[0].v, "%s: unknown tier %q", ctx, short(name))
		return nil, true, false
	}
	use := tierUse{name, kind}
	if tv, done := l.tierUses[use]; done {
		return tv, true, tv != nil
	}
	tv = &TierValue{Tier: rt.tier, vals: make(map[string]tierNum, len(rt.vals))}
	good := rt.tier.Key != nil
	for _, e := range rt.vals {
		n, ok := l.tierNumber(e.v, "tiers."+name+".values."+short(e.key)+" (as "+ctx+")", kind)
		tv.vals[e.key], good = n, good && ok
	}
	if rt.def != nil {
		tv.def, ok = l.tierNumber(rt.def, "tiers."+name+".default (as "+ctx+")", kind)
		tv.hasDef, good = true, good && ok
	}
	if !good {
		tv = nil
	}
	l.tierUses[use] = tv
	return tv, true, tv != nil
}

// tierNumber parses one tier value as kind.
func (l *loader) tierNumber(v *yaml.Node, ctx string, kind numKind) (tierNum, bool) {
	switch kind {
	case numRate:
		r, p, ok := l.rate(v, ctx)
		return tierNum{n: r, periodMs: p}, ok
	case numBurst:
		n, ok := l.integer(v, ctx, 0, math.MaxUint32)
		return tierNum{n: uint32(n)}, ok
	case numCost:
		n, ok := l.integer(v, ctx, 1, math.MaxUint32)
		return tierNum{n: uint32(n)}, ok
	default:
		d, ok := l.wholeMs(v, ctx)
		return tierNum{n: uint32(d / time.Millisecond)}, ok
	}
}

// wholeMs parses a guard threshold: a duration of whole milliseconds,
// 1ms..4294967295ms.
func (l *loader) wholeMs(v *yaml.Node, ctx string) (time.Duration, bool) {
	d, ok := l.duration(v, ctx, time.Millisecond, time.Duration(math.MaxUint32)*time.Millisecond)
	if ok && d%time.Millisecond != 0 {
		l.errorf(v, "%s: must be whole milliseconds, got %s", ctx, d)
		ok = false
	}
	return d, ok
}

// checkCapacity reports a zone whose cost can exceed its capacity (burst,
// or rate when burst is 0): no such request could ever pass. With tiers,
// every key is checked when the tiered numbers share one tier; numbers
// from different tiers are checked at their worst combination.
func (l *loader) checkCapacity(z *Zone, at *yaml.Node, ctx string) {
	capOf := func(rate, burst uint32) uint32 {
		if burst == 0 {
			return rate
		}
		return burst
	}
	type pick struct {
		tv *TierValue
		st uint32
	}
	fields := [3]pick{{z.RateTier, z.Rate}, {z.BurstTier, z.Burst}, {z.CostTier, z.Cost}}
	var shared *Tier
	mixed := false
	for _, f := range fields {
		if f.tv != nil {
			if shared != nil && shared != f.tv.Tier {
				mixed = true
			}
			shared = f.tv.Tier
		}
	}
	if !mixed {
		keys := []string{""}
		if shared != nil {
			keys = append(shared.Keys, "") // "" stands for the default
		}
		for _, key := range keys {
			var v [3]uint32
			have := true
			for i, f := range fields {
				v[i] = f.st
				if f.tv != nil {
					n, found := f.tv.vals[key], key != ""
					if key == "" {
						n, found = f.tv.def, f.tv.hasDef
					}
					v[i], have = n.n, have && found
				}
			}
			switch {
			case !have || v[2] <= capOf(v[0], v[1]):
			case shared == nil:
				l.errorf(at, "%s: cost %d exceeds the bucket capacity %d (burst, or rate when burst is 0): no request could ever pass", ctx, v[2], capOf(v[0], v[1]))
			default:
				which := "the default"
				if key != "" {
					which = "tier key " + short(key)
				}
				l.errorf(at, "%s: cost %d exceeds the bucket capacity %d (burst, or rate when burst is 0) for %s: no such request could ever pass", ctx, v[2], capOf(v[0], v[1]), which)
			}
		}
		return
	}
	all := func(f pick) []uint32 {
		if f.tv == nil {
			return []uint32{f.st}
		}
		var out []uint32
		for _, n := range f.tv.vals {
			out = append(out, n.n)
		}
		if f.tv.hasDef {
			out = append(out, f.tv.def.n)
		}
		return out
	}
	minRate, minCap, maxCost := uint32(math.MaxUint32), uint32(math.MaxUint32), uint32(0)
	for _, r := range all(fields[0]) {
		minRate = min(minRate, r)
	}
	for _, b := range all(fields[1]) {
		minCap = min(minCap, capOf(minRate, b))
	}
	for _, c := range all(fields[2]) {
		maxCost = max(maxCost, c)
	}
	if maxCost > minCap {
		l.errorf(at, "%s: a cost of %d can exceed the smallest bucket capacity %d (rate, burst and cost come from different tiers): such a request could never pass", ctx, maxCost, minCap)
	}
}
