package admission

// MaxTierKeyLen bounds a rendered tier key; a longer key matches no value.
const MaxTierKeyLen = 256

// Tier is a named map from a rendered key to a number, like nginx's map:
// a zone's rate, burst or cost, or a guard's threshold, may take its value
// from a tier instead of a literal, so one zone can carry per-plan limits.
type Tier struct {
	Name string
	Key  *Template // rendered per request; its value picks the entry
	Keys []string  // the entries' keys, in file order
	Line int
}

// TierValue is a tier as used by one numeric field: the field's value for
// every key, and the default for keys the tier does not list.
type TierValue struct {
	Tier   *Tier
	vals   map[string]tierNum
	def    tierNum
	hasDef bool
}

// tierNum is one value: n (rate, burst, cost or threshold ms) and, for a
// rate, its period.
type tierNum struct{ n, periodMs uint32 }

// lookup renders the tier's key for r at the end of buf (restoring buf's
// length) and returns the value it selects. ok is false when the key
// matches no entry and the tier has no default: the value cannot be
// rendered (ratelimitly.CauseInvalidValue). A key that cannot be rendered
// (over MaxTierKeyLen) matches no entry. It does not allocate when buf has
// room.
func (tv *TierValue) lookup(buf []byte, r *Request) ([]byte, tierNum, bool) {
	start := len(buf)
	out, err := tv.Tier.Key.Render(buf, r)
	if err == nil {
		v, found := tv.vals[string(out[start:])] // no allocation: map lookup by converted bytes
		if found {
			return out[:start], v, true
		}
	}
	return out[:start], tv.def, tv.hasDef
}

// Default is the value for keys the tier does not list (ok false when
// there is none).
func (tv *TierValue) Default() (n, periodMs uint32, ok bool) {
	return tv.def.n, tv.def.periodMs, tv.hasDef
}

// Tiered reports whether any of the zone's numbers comes from a tier.
func (z *Zone) Tiered() bool { return z.RateTier != nil || z.BurstTier != nil || z.CostTier != nil }

// numbers renders the zone's rate, burst and cost for r. ok is false when a
// tier has no value for the request's key.
func (z *Zone) numbers(buf []byte, r *Request) (_ []byte, rate, periodMs, burst, cost uint32, ok bool) {
	rate, periodMs, burst, cost = z.Rate, z.PeriodMs, z.Burst, z.Cost
	var v tierNum
	if z.RateTier != nil {
		if buf, v, ok = z.RateTier.lookup(buf, r); !ok {
			return buf, 0, 0, 0, 0, false
		}
		rate, periodMs = v.n, v.periodMs
	}
	if z.BurstTier != nil {
		if buf, v, ok = z.BurstTier.lookup(buf, r); !ok {
			return buf, 0, 0, 0, 0, false
		}
		burst = v.n
	}
	if z.CostTier != nil {
		if buf, v, ok = z.CostTier.lookup(buf, r); !ok {
			return buf, 0, 0, 0, 0, false
		}
		cost = v.n
	}
	return buf, rate, periodMs, burst, cost, true
}
