package simulate

import (
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

// Result is what a replay found.
type Result struct {
	Lines          int64            `json:"lines"`           // lines read
	Replayed       int64            `json:"replayed"`        // access lines replayed
	NotAccess      int64            `json:"not_access"`      // other log lines (start, reload, ...)
	Malformed      int64            `json:"malformed"`       // lines that did not parse
	FirstMalformed int64            `json:"first_malformed"` // line number of the first (0: none)
	Oversized      int64            `json:"oversized"`       // lines over MaxLine bytes
	From           time.Time        `json:"from"`            // virtual time of the first and last line
	To             time.Time        `json:"to"`
	Warnings       []string         `json:"warnings"`
	Locations      []LocationResult `json:"locations"`
}

// LocationResult is one location of the new policy (Location "-": the
// service's requests no location matched, or a service it lacks).
type LocationResult struct {
	Service    string           `json:"service"`
	Location   string           `json:"location"`
	Requests   int64            `json:"requests"`
	WouldAllow int64            `json:"would_allow"`
	WouldDeny  int64            `json:"would_deny"`
	FirstDeny  *time.Time       `json:"first_deny,omitempty"`
	Outcomes   map[string]int64 `json:"outcomes"`
	Causes     map[string]int64 `json:"causes"`
	// What the log recorded for the same requests, and where the new
	// policy disagrees with it.
	RecordedAdmitted     int64 `json:"recorded_admitted"`
	RecordedDenied       int64 `json:"recorded_denied"`
	DenyRecordedAdmitted int64 `json:"deny_recorded_admitted"` // would deny, were admitted
	AllowRecordedDenied  int64 `json:"allow_recorded_denied"`  // would admit, were denied
	// OtherLocation counts requests the log recorded under another
	// location name.
	OtherLocation int64         `json:"other_location"`
	Zones         []ZoneResult  `json:"zones,omitempty"`
	Guards        []GuardResult `json:"guards,omitempty"`
}

// ZoneResult is one zone of a location: how often it was short in a
// would-deny, and the keys most often short (Space-Saving: Denies is an
// upper bound, Denies − Error a lower bound).
type ZoneResult struct {
	Zone      string     `json:"zone"`
	WouldDeny int64      `json:"would_deny"`
	FirstDeny *time.Time `json:"first_deny,omitempty"`
	TopKeys   []KeyCount `json:"top_keys"`
}

// KeyCount is one would-deny key of a zone.
type KeyCount struct {
	Key       string `json:"key"`
	Truncated bool   `json:"truncated,omitempty"`
	Denies    uint64 `json:"denies"`
	Error     uint64 `json:"error"`
}

// GuardResult is one guard of a location, by tracker.
type GuardResult struct {
	Tracker   string     `json:"tracker"`
	WouldDeny int64      `json:"would_deny"`
	FirstDeny *time.Time `json:"first_deny,omitempty"`
}

type zoneStats struct {
	ZoneResult
	top *topkeys.SpaceSaving
}

type locStats struct {
	LocationResult
	zones  []zoneStats
	guards []GuardResult
}

func newLocStats(service string, l *admission.Location) *locStats {
	ls := &locStats{LocationResult: LocationResult{Service: service, Location: "-",
		Outcomes: map[string]int64{}, Causes: map[string]int64{}}}
	if l == nil {
		return ls
	}
	ls.Location = l.Name
	for _, z := range l.Limits {
		ls.zones = append(ls.zones, zoneStats{ZoneResult: ZoneResult{Zone: z.Name}, top: topkeys.New(TopKeys)})
	}
	for _, g := range l.Guards {
		ls.guards = append(ls.guards, GuardResult{Tracker: g.Tracker.Name})
	}
	return ls
}

func firstAt(p **time.Time, at time.Time) {
	if *p == nil {
		t := at
		*p = &t
	}
}

func (ls *locStats) count(r *Record, d *admission.Decision, admitted bool, at time.Time, seed maphash.Seed) {
	ls.Requests++
	ls.Outcomes[d.Outcome.String()]++
	ls.Causes[d.Cause.String()]++
	wasAdmitted, wasDenied := recordedAdmitted(r), recordedDenied(r)
	if wasAdmitted {
		ls.RecordedAdmitted++
	}
	if wasDenied {
		ls.RecordedDenied++
	}
	if string(r.Location) != ls.Location {
		ls.OtherLocation++
	}
	if admitted {
		ls.WouldAllow++
		if wasDenied {
			ls.AllowRecordedDenied++
		}
	} else {
		ls.WouldDeny++
		firstAt(&ls.FirstDeny, at)
		if wasAdmitted {
			ls.DenyRecordedAdmitted++
		}
	}
	// Which zones were short and which guards failed: in a deny and in a
	// shadow would-deny alike.
	if !d.Result.Valid || d.Cause != ratelimitly.CauseDenyResource && d.Cause != ratelimitly.CauseDenyGuard {
		return
	}
	for i, rr := range d.Result.Resp.Resources {
		if rr.TokensDeficit == 0 || i >= len(ls.zones) || i >= len(d.Req.Resources) {
			continue
		}
		z := &ls.zones[i]
		z.WouldDeny++
		firstAt(&z.FirstDeny, at)
		b := d.Req.Resources[i].Bucket
		z.top.Add(maphash.Bytes(seed, b), b)
	}
	for i, gr := range d.Result.Resp.Guards {
		if !gr.Passed && i < len(ls.guards) {
			ls.guards[i].WouldDeny++
			firstAt(&ls.guards[i].FirstDeny, at)
		}
	}
}

// Result returns what was replayed so far: the policy's locations in
// order, then the unmatched requests by service name.
func (s *Simulator) Result() *Result {
	res := s.res
	res.Locations = nil
	add := func(ls *locStats) {
		lr := ls.LocationResult
		lr.Zones = nil
		for i := range ls.zones {
			z := ls.zones[i].ZoneResult
			z.TopKeys = topOf(ls.zones[i].top, s.opts.Top)
			lr.Zones = append(lr.Zones, z)
		}
		lr.Guards = slices.Clone(ls.guards)
		res.Locations = append(res.Locations, lr)
	}
	for _, svc := range s.pol.Services {
		for _, l := range svc.Locations {
			add(s.locs[l])
		}
	}
	names := make([]string, 0, len(s.unmatched))
	for n := range s.unmatched {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		add(s.unmatched[n])
	}
	return &res
}

// WriteText writes res for a terminal: a summary, then one block per
// location that saw requests.
func WriteText(w io.Writer, res *Result, took time.Duration) error {
	var b strings.Builder
	rate := 0.0
	if took > 0 {
		rate = float64(res.Lines) / took.Seconds()
	}
	fmt.Fprintf(&b, "replayed %d access lines of %d read in %v (%.0f lines/s)", res.Replayed, res.Lines, took.Round(time.Millisecond), rate)
	if res.Replayed > 0 {
		fmt.Fprintf(&b, ", virtual time %s to %s (%v)", stamp(res.From), stamp(res.To), res.To.Sub(res.From))
	}
	b.WriteString("\n")
	if res.NotAccess+res.Malformed+res.Oversized > 0 {
		fmt.Fprintf(&b, "skipped: %d other log lines, %d malformed", res.NotAccess, res.Malformed)
		if res.FirstMalformed > 0 {
			fmt.Fprintf(&b, " (first at line %d)", res.FirstMalformed)
		}
		fmt.Fprintf(&b, ", %d over %d bytes\n", res.Oversized, MaxLine)
	}
	for _, wn := range res.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", wn)
	}
	for _, l := range res.Locations {
		if l.Requests == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nservice %s location %s: %d requests, would allow %d, would deny %d", l.Service, l.Location, l.Requests, l.WouldAllow, l.WouldDeny)
		if l.FirstDeny != nil {
			fmt.Fprintf(&b, ", first deny %s", stamp(*l.FirstDeny))
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "  outcomes: %s\n", counts(l.Outcomes))
		fmt.Fprintf(&b, "  causes: %s\n", counts(l.Causes))
		fmt.Fprintf(&b, "  recorded: %d admitted, %d denied; would deny %d that were admitted, would admit %d that were denied; %d were logged under another location\n",
			l.RecordedAdmitted, l.RecordedDenied, l.DenyRecordedAdmitted, l.AllowRecordedDenied, l.OtherLocation)
		for _, z := range l.Zones {
			fmt.Fprintf(&b, "  zone %s: short in %d", z.Zone, z.WouldDeny)
			if z.FirstDeny != nil {
				fmt.Fprintf(&b, ", first %s", stamp(*z.FirstDeny))
			}
			b.WriteString("\n")
			for _, k := range z.TopKeys {
				fmt.Fprintf(&b, "    %q %d", k.Key, k.Denies)
				if k.Error > 0 {
					fmt.Fprintf(&b, " (at least %d)", k.Denies-k.Error)
				}
				if k.Truncated {
					b.WriteString(" (key cut)")
				}
				b.WriteString("\n")
			}
		}
		for _, g := range l.Guards {
			fmt.Fprintf(&b, "  guard %s: failed in %d", g.Tracker, g.WouldDeny)
			if g.FirstDeny != nil {
				fmt.Fprintf(&b, ", first %s", stamp(*g.FirstDeny))
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func counts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
