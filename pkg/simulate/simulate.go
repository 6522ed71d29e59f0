// Package simulate replays recorded access lines through a policy: the
// real matching, rendering, zones, tiers and guards of pkg/admission
// against pkg/rlserver's decision engine in virtual time (the lines'
// timestamps are the clock), and says what the policy would have done.
package simulate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

// Formats of access logs.
const (
	FormatJSON     = "json"
	FormatCombined = "combined"
)

// MaxLine is the longest access line read; longer lines are skipped and
// counted as oversized.
const MaxLine = 64 << 10

// TopKeys is the number of keys each zone's summary holds (Space-Saving
// counters); the report shows the first Options.Top of them.
const TopKeys = 64

// sweepEvery is the virtual time between drops of idle engine state.
const sweepEvery = time.Minute

// Options configure a replay.
type Options struct {
	Format string // FormatJSON (default) or FormatCombined
	Top    int    // keys shown per zone (default 5, at most TopKeys)
	// Progress, if set, is called every ProgressEvery lines read.
	Progress func(lines int64)
}

// ProgressEvery is how often Options.Progress is called, in lines.
const ProgressEvery = 1 << 16

// Simulator replays lines through one policy. Not safe for concurrent use.
type Simulator struct {
	pol     *admission.Policy
	opts    Options
	parse   func([]byte, *Record) error
	svcs    map[string]*admission.Service
	eng     admission.Engine
	rl      *rlserver.Engine
	seed    maphash.Seed
	clock   time.Time
	started bool
	swept   time.Time

	rec  Record
	areq admission.Request
	dec  admission.Decision
	hdr  logHeaders
	path []byte
	rep  []byte

	locs      map[*admission.Location]*locStats
	unmatched map[string]*locStats
	res       Result
}

// New returns a Simulator for pol.
func New(pol *admission.Policy, opts Options) (*Simulator, error) {
	s := &Simulator{pol: pol, opts: opts, svcs: map[string]*admission.Service{}, seed: maphash.MakeSeed(),
		locs: map[*admission.Location]*locStats{}, unmatched: map[string]*locStats{}}
	switch opts.Format {
	case "", FormatJSON:
		s.parse, s.opts.Format = ParseJSON, FormatJSON
	case FormatCombined:
		s.parse = ParseCombined
	default:
		return nil, fmt.Errorf("format %q: want json or combined", opts.Format)
	}
	if s.opts.Top <= 0 {
		s.opts.Top = 5
	}
	s.opts.Top = min(s.opts.Top, TopKeys)
	for _, svc := range pol.Services {
		s.svcs[svc.Name] = svc
		for _, l := range svc.Locations {
			s.locs[l] = newLocStats(svc.Name, l)
		}
	}
	s.hdr.rec = &s.rec
	s.hdr.ridName = pol.RequestID.Header
	s.eng = admission.Engine{Checker: s, Now: func() time.Time { return s.clock },
		Local: admission.NewLocalLimiter(func() time.Time { return s.clock }, 0)}
	s.res.Warnings = Unreplayable(pol, s.opts.Format)
	rl, err := rlserver.NewEngine("simulate", time.Unix(0, 0), 0, 0)
	if err != nil {
		return nil, err
	}
	s.rl = rl
	return s, nil
}

// Run replays every line of r and returns the result. A read error
// (not a malformed or oversized line, which are counted and skipped)
// ends it with the error.
func (s *Simulator) Run(r io.Reader) (*Result, error) {
	br := bufio.NewReaderSize(r, MaxLine)
	var n int64
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			s.res.Oversized++
			s.res.Lines++
			n++
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of it
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return s.Result(), fmt.Errorf("read access log: %w", err)
			}
			continue
		}
		if len(line) > 0 {
			n++
			s.Line(trimEOL(line))
			if s.opts.Progress != nil && n%ProgressEvery == 0 {
				s.opts.Progress(n)
			}
		}
		if errors.Is(err, io.EOF) {
			return s.Result(), nil
		}
		if err != nil {
			return s.Result(), fmt.Errorf("read access log: %w", err)
		}
	}
}

func trimEOL(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	if len(b) > 0 && b[len(b)-1] == '\r' {
		b = b[:len(b)-1]
	}
	return b
}

// Line replays one access line (without its newline).
func (s *Simulator) Line(line []byte) {
	s.res.Lines++
	if len(line) > MaxLine {
		s.res.Oversized++
		return
	}
	switch err := s.parse(line, &s.rec); {
	case errors.Is(err, ErrNotAccess):
		s.res.NotAccess++
		return
	case err != nil:
		s.res.Malformed++
		if s.res.FirstMalformed == 0 {
			s.res.FirstMalformed = s.res.Lines
		}
		return
	}
	// Lines are written when responses end, by several loops: virtual
	// time never goes back.
	if !s.started || s.rec.Time.After(s.clock) {
		s.clock = s.rec.Time
	}
	if !s.started {
		s.started, s.swept, s.res.From = true, s.clock, s.clock
	}
	if s.clock.Sub(s.swept) >= sweepEvery {
		s.rl.Sweep(s.clock)
		s.swept = s.clock
	}
	s.res.To = s.clock
	s.res.Replayed++
	s.replay()
}

func (s *Simulator) replay() {
	r := &s.rec
	svc := s.svcs[string(r.Service)]
	s.areq = admission.Request{Method: r.Method, Host: r.Host, Query: r.Query, Headers: &s.hdr, SNI: r.SNI, ALPN: r.ALPN}
	s.areq.Remote = parseRemote(r.Remote)
	if p, ok := admission.NormalizePath(s.path[:0], r.Path); ok {
		s.path, s.areq.Path = p, p
	} else {
		s.areq.Path = r.Path
	}
	s.eng.Decide(context.Background(), s.pol, svc, &s.areq, &s.dec)
	d := &s.dec
	var ls *locStats
	if d.Location != nil {
		ls = s.locs[d.Location]
	} else {
		name := "-"
		if svc != nil {
			name = svc.Name
		} else if len(r.Service) > 0 {
			name = string(r.Service)
		}
		if ls = s.unmatched[name]; ls == nil {
			ls = newLocStats(name, nil)
			s.unmatched[name] = ls
		}
	}
	admitted := d.Action == admission.ActionAdmit
	ls.count(r, d, admitted, s.clock, s.seed)
	if loc := d.Location; loc != nil && loc.Report != nil && r.HasDuration && recordedAdmitted(r) &&
		admission.ShouldReport(true, d.Outcome, admitted, false) {
		rep, err := loc.Report.Service.Render(s.rep[:0], &s.areq)
		s.rep = rep
		if err == nil && len(rep) > 0 && len(rep) <= admission.MaxBucketLen {
			s.rl.Report(rep, admission.ReportMs(time.Duration(r.DurationMs*float64(time.Millisecond))), s.clock)
		}
	}
}

// Check implements admission.Checker against the in-process engine at
// the virtual time.
func (s *Simulator) Check(_ context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	resp := s.rl.Decide(req, s.clock)
	out.Valid = true
	out.Resp.Status, out.Resp.Success, out.Resp.ServerEpoch = resp.Status, resp.Success, resp.ServerEpoch
	out.Resp.Guards = append(out.Resp.Guards[:0], resp.Guards...)
	out.Resp.Resources = append(out.Resp.Resources[:0], resp.Resources...)
}

// Report implements admission.Checker; the engine never calls it.
func (s *Simulator) Report([]byte, time.Duration) {}

func parseRemote(b []byte) netip.AddrPort {
	if len(b) == 0 {
		return netip.AddrPort{}
	}
	if ap, err := netip.ParseAddrPort(string(b)); err == nil {
		return ap
	}
	if a, err := netip.ParseAddr(string(b)); err == nil { // combined: no port
		return netip.AddrPortFrom(a, 0)
	}
	return netip.AddrPort{}
}

// recordedAdmitted says whether the line's request went to the service
// (its duration is then the service's latency).
func recordedAdmitted(r *Record) bool {
	switch string(r.Outcome) {
	case "allow", "fail_open", "bypass", "shadow_deny":
		return true
	case "fail_local":
		return len(r.DenyZones) == 0
	}
	return false
}

func recordedDenied(r *Record) bool {
	switch string(r.Outcome) {
	case "deny", "fail_close":
		return true
	case "fail_local":
		return len(r.DenyZones) > 0
	}
	return false
}

// logHeaders are the request fields an access line carries.
type logHeaders struct {
	rec     *Record
	ridName string
}

// HeaderValue implements admission.HeaderGetter.
func (h *logHeaders) HeaderValue(name string) ([]byte, bool) {
	var v []byte
	switch {
	case strings.EqualFold(name, "user-agent"):
		v = h.rec.UserAgent
	case strings.EqualFold(name, "referer"):
		v = h.rec.Referer
	case strings.EqualFold(name, "traceparent"):
		v = h.rec.Traceparent
	case h.ridName != "" && strings.EqualFold(name, h.ridName):
		v = h.rec.ReqID
	}
	return v, v != nil
}

// Unreplayable lists what of pol an access line in format cannot supply:
// template variables and header conditions a replay renders as missing.
func Unreplayable(pol *admission.Policy, format string) []string {
	var out []string
	seen := map[string]bool{}
	note := func(what, v string) {
		msg := fmt.Sprintf("%s uses %s, which access lines do not carry: replayed as missing", what, v)
		if !seen[msg] {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	check := func(what string, t *admission.Template) {
		for _, v := range t.Variables() {
			if !carried(v, format, pol.RequestID.Header) {
				note(what, v)
			}
		}
	}
	for _, svc := range pol.Services {
		for _, l := range svc.Locations {
			where := fmt.Sprintf("service %s location %s", svc.Name, l.Name)
			for _, hc := range l.Match.Headers {
				if !carried("header."+hc.Name, format, pol.RequestID.Header) {
					note(where+" match", "header."+hc.Name)
				}
			}
			if l.Label != nil {
				check(where+" label", l.Label)
			}
			for _, z := range l.Limits {
				check("zone "+z.Name, z.Bucket)
			}
			for _, g := range l.Guards {
				check("tracker "+g.Tracker.Name, g.Tracker.Service)
			}
			if l.Report != nil {
				check("tracker "+l.Report.Name, l.Report.Service)
			}
		}
	}
	slices.Sort(out)
	return out
}

func carried(v, format, ridName string) bool {
	switch {
	case v == "remote_port":
		return format == FormatJSON
	case v == "server_addr", v == "server_port", strings.HasPrefix(v, "cookie."):
		return false
	case strings.HasPrefix(v, "header."):
		h := strings.TrimPrefix(v, "header.")
		return strings.EqualFold(h, "user-agent") || strings.EqualFold(h, "referer") ||
			strings.EqualFold(h, "traceparent") || (ridName != "" && strings.EqualFold(h, ridName))
	}
	return true
}

// Top keys of a zone.
func topOf(ss *topkeys.SpaceSaving, n int) []KeyCount {
	var all []KeyCount
	ss.Each(func(_ uint64, c topkeys.Counter) {
		all = append(all, KeyCount{Key: c.Key, Truncated: c.Truncated, Denies: c.Count, Error: c.Err})
	})
	slices.SortFunc(all, func(a, b KeyCount) int {
		if a.Denies != b.Denies {
			if a.Denies > b.Denies {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	return all[:min(n, len(all))]
}
