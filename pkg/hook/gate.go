// Package hook plugs admission into the data path: it is the exchange.Hook
// that, per request, runs the admission engine against the current
// RateLimitly checker (swapped live on reload), writes the deny answer,
// sends the latency report the contract allows and records the request's
// verdict, outcome and cause in the access log and metrics. It is also a
// proxy.AsyncHook (async.go): on the event-loop path Begin decides without
// blocking and the RateLimitly answer resumes the request. The rules
// themselves live in pkg/admission.
package hook

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

// Config configures a Gate.
type Config struct {
	Metrics *metrics.Metrics // nil = a private registry
	// AccessLog receives one line per request at info level; nil discards.
	AccessLog *slog.Logger
	// Logger receives operational messages (client swaps); nil discards.
	Logger *slog.Logger
	Now    func() time.Time // nil = time.Now
	// TopKeys, if set, counts each zone's allows and denies by key
	// (GET /top on the admin listener).
	TopKeys *topkeys.Registry
}

// Gate is the admission hook of the proxy. Policies and checkers are
// swapped atomically; a request keeps the policy generation and checker it
// started with until Done.
type Gate struct {
	cur      atomic.Pointer[generation]
	checker  atomic.Pointer[checkerRef]
	local    *admission.LocalLimiter
	m        *metrics.Metrics
	top      *topkeys.Registry
	access   *slog.Logger
	log      *slog.Logger
	now      func() time.Time
	engNow   func() time.Time // Config.Now for the engine: nil times decisions by the monotonic clock alone
	pool     sync.Pool
	causes   []counter
	inflight interface {
		Inc()
		Dec()
	}
	genSeq atomic.Uint64
	// lastLocalWarn is when the fail: local warning was last logged (unix ns).
	lastLocalWarn atomic.Int64
	// lastRejectLog is when a rejection was last logged (unix ns);
	// rejectsUnlogged counts the rejections since.
	lastRejectLog   atomic.Int64
	rejectsUnlogged atomic.Int64
	mu              sync.Mutex // serialises Swap/SetChecker
	// eng runs Begin's Engine.Begin and End (they never call a Checker).
	eng admission.Engine
	// pending counts the requests whose check runs (Begin returned
	// false); Cancel finds a request's state in its HookState.
	pending atomic.Int64
}

type counter interface{ Inc() }

// generation is one policy with everything precomputed for it.
type generation struct {
	pol       *admission.Policy
	gen       uint64
	locs      map[*admission.Location]*locInfo
	unmatched map[string]*locInfo // by service name ("-" = no service)
	byName    map[string]*admission.Service
	// ridName is the request id field (policy request_id.header);
	// ridGenerate says whether to create an id the client did not send.
	ridName     []byte
	ridGenerate bool
}

type locInfo struct {
	name   string
	answer *admission.DenyAnswer
	m      *metrics.Location
	// zoneDenials and guardDenials are indexed like the location's
	// Limits and Guards.
	zoneDenials, guardDenials []counter
	// top is each zone's top-keys summary, indexed like Limits (nil
	// without Config.TopKeys).
	top []*topkeys.Zone
}

// internalBody is the answer to an internal failure.
var internalBody = []byte("500 Internal Server Error\n")

// New returns a Gate with no policy (Admit admits everything as unmatched
// until Swap) and no checker (protected requests fail as no_endpoints
// until SetChecker).
func New(cfg Config) *Gate {
	g := &Gate{m: cfg.Metrics, top: cfg.TopKeys, access: cfg.AccessLog, log: cfg.Logger, now: cfg.Now, engNow: cfg.Now}
	if g.m == nil {
		g.m = metrics.New("dev", "unknown")
	}
	if g.access == nil {
		g.access = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if g.log == nil {
		g.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.local = admission.NewLocalLimiter(g.now, 0)
	g.inflight = g.m.Inflight()
	for _, c := range ratelimitly.CauseNames() {
		g.causes = append(g.causes, g.m.Cause(c))
	}
	g.pool.New = func() any {
		st := &state{buf: make([]byte, 0, admission.AnswerBufSize), rid: make([]byte, 0, MaxRequestIDLen),
			fwd: make([]httpparse.Header, 0, 1), g: g}
		st.tk.st = st
		return st
	}
	g.eng = admission.Engine{Local: g.local, Now: g.engNow}
	g.checker.Store(&checkerRef{c: noChecker{}})
	return g
}

// Metrics returns the gate's metrics.
func (g *Gate) Metrics() *metrics.Metrics { return g.m }

// Swap installs a new policy for requests that start from now on and
// returns its generation number (1 for the first). The policy's warnings
// are logged.
func (g *Gate) Swap(p *admission.Policy) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range p.Warnings { // what rl-tproxy check prints, for a running proxy
		g.log.Warn("policy warning", "file", w.File, "line", w.Line, "warning", w.Msg)
	}
	gen := &generation{pol: p, gen: g.genSeq.Add(1), locs: map[*admission.Location]*locInfo{},
		unmatched: map[string]*locInfo{}, byName: map[string]*admission.Service{},
		ridName: []byte(p.RequestID.Header), ridGenerate: p.RequestID.Generate}
	noLoc := func(svc string) *locInfo {
		return &locInfo{name: "-", answer: admission.NewDenyAnswer(admission.AnswerSpec{}),
			m: g.m.Location(svc, "-", "", admission.DefaultDenyStatus)}
	}
	gen.unmatched["-"] = noLoc("-")
	var zones []string
	for _, s := range p.Services {
		gen.byName[s.Name] = s
		gen.unmatched[s.Name] = noLoc(s.Name)
		for _, l := range s.Locations {
			a := admission.LocationAnswer(l)
			report := ""
			if l.Report != nil {
				report = l.Report.Name
			}
			info := &locInfo{name: l.Name, answer: a, m: g.m.Location(s.Name, l.Name, report, a.Status)}
			for _, z := range l.Limits {
				info.zoneDenials = append(info.zoneDenials, g.m.Denial(s.Name, l.Name, metrics.DenialZone, z.Name))
				if g.top != nil {
					info.top = append(info.top, g.top.Zone(z.Name))
					zones = append(zones, z.Name)
				}
			}
			for _, gd := range l.Guards {
				info.guardDenials = append(info.guardDenials, g.m.Denial(s.Name, l.Name, metrics.DenialGuard, gd.Tracker.Name))
			}
			gen.locs[l] = info
		}
	}
	g.cur.Store(gen)
	g.m.Prune() // the series of what this policy no longer names
	g.top.Retain(zones)
	g.m.PolicyLoaded(gen.gen, float64(g.now().UnixNano())/1e9)
	return gen.gen
}

// Policy returns the policy in force (nil before the first Swap) and its
// generation.
func (g *Gate) Policy() (*admission.Policy, uint64) {
	gen := g.cur.Load()
	if gen == nil {
		return nil, 0
	}
	return gen.pol, gen.gen
}

// state is the per-request admission state, pooled.
type state struct {
	gen    *generation
	info   *locInfo
	ref    *checkerRef
	svc    string
	areq   admission.Request
	dec    admission.Decision
	hdrs   [4]httpparse.Header // the deny answer's 3 fields and the request id, or an allow's 2 RateLimit fields
	fwd    []httpparse.Header  // fields added upstream (a generated request id)
	rid    []byte              // the request id ("" when none)
	buf    []byte
	report []byte
	path   []byte   // the normalized path matched and rendered ({path})
	hv     [][]byte // the client_address header's lines (realip reads them)

	// The asynchronous path (Begin): the request, the proxy's Decision
	// and Resumer while the check runs, and the check itself.
	g   *Gate
	r   *exchange.Request
	pd  *exchange.Decision
	res proxy.Resumer
	// phase is pendNone, pendRunning while Begin's check runs, or
	// pendCancelled once Cancel came before the check ended.
	phase atomic.Int32
	tk    ticket
}

// AdmitReturnsOnContextEnd marks the Gate as a exchange.ContextBound Hook:
// its checks end with their context (the RateLimitly client's wait and
// the engine's decision both select on it), so the HTTP/2 path calls
// Admit on the stream's own goroutine.
func (g *Gate) AdmitReturnsOnContextEnd() {}

// Admit implements exchange.Hook.
func (g *Gate) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	st, svc := g.prepare(r)
	if st.gen == nil {
		return st.unmatched()
	}
	eng := admission.Engine{Checker: st, Local: g.local, Now: g.engNow}
	g.inflight.Inc()
	eng.Decide(ctx, st.gen.pol, svc, &st.areq, &st.dec)
	g.inflight.Dec()
	return g.decision(st)
}

// prepare takes a pooled state for r and fills what every path needs
// before deciding: the policy generation and checker in force, the
// normalized path, the admission request, the service and the request
// id. It returns the policy's service (nil when the policy has none).
func (g *Gate) prepare(r *exchange.Request) (*state, *admission.Service) {
	st := g.pool.Get().(*state)
	st.gen = g.cur.Load()
	st.ref = g.acquire()
	// Match and render on the normalized path, the one the upstream will
	// act on: otherwise "/%61pi/" or "//api/" would slip past a
	// path_prefix: /api/ rule. The parser already rejected malformed
	// escapes, so only a target without a leading '/' (OPTIONS *, an
	// absolute-form target without a path) keeps its raw form.
	path, ok := admission.NormalizePath(st.path[:0], r.Path)
	if ok {
		st.path = path
	} else {
		path = r.Path
	}
	st.areq = admission.Request{Remote: r.Remote, Local: r.Local, Path: path, Query: r.Query, Headers: r}
	if r.Head != nil {
		st.areq.Method, st.areq.Host = r.Head.Method, r.Head.Host
	}
	st.areq.SNI, st.areq.ALPN = r.SNI, r.ALPN
	var svc *admission.Service
	if st.gen != nil {
		svc = st.gen.pol.ServiceFor(r.Local)
		if svc == nil && r.Service != nil {
			svc = st.gen.byName[r.Service.Name]
		}
	}
	if r.Peer.IsValid() { // a PROXY header named the client (exchange.Service.AcceptProxy)
		st.areq.Peer = r.Peer
	} else if svc != nil && svc.ClientAddress != nil && svc.ClientAddress.Header() != "" && r.Head != nil {
		st.clientFrom(svc.ClientAddress, r)
	}
	switch {
	case svc != nil:
		st.svc = svc.Name
	case r.Service != nil:
		st.svc = r.Service.Name
	default:
		st.svc = "-"
	}
	st.requestID(r.Head)
	return st, svc
}

// clientFrom names the request's client from the service's forwarding
// header when the peer is trusted: st.areq.Remote becomes the client and
// st.areq.Peer the TCP peer ({remote_addr}, {peer_addr}, the access
// line), and so do r.Remote and r.Peer (the forwarding fields the proxy
// sends upstream name r.Remote). It does not allocate once st.hv has
// grown to the header's line count.
func (st *state) clientFrom(ca *admission.ClientAddress, r *exchange.Request) {
	name := ca.Header()
	hv := st.hv[:0]
	for i := range r.Head.Headers {
		if h := &r.Head.Headers[i]; httpparse.EqualFold(h.Name, name) {
			hv = append(hv, h.Value)
		}
	}
	if client, peer := ca.Resolve(r.Remote, hv), r.Remote; client != peer {
		st.areq.Remote, st.areq.Peer = client, peer
		r.Remote, r.Peer = client, peer
	}
	clear(hv) // the values alias the request's buffer
	st.hv = hv[:0]
}

// unmatched is the Decision without a policy: admit, count nothing.
func (st *state) unmatched() exchange.Decision {
	st.dec.Reset()
	st.info = nil
	return exchange.Decision{Allow: true, State: st}
}

// decision turns st's admission decision into the proxy's.
func (g *Gate) decision(st *state) exchange.Decision {
	if st.dec.Location != nil {
		st.info = st.gen.locs[st.dec.Location]
	} else if st.info = st.gen.unmatched[st.svc]; st.info == nil {
		st.info = st.gen.unmatched["-"]
	}
	switch st.dec.Action {
	case admission.ActionAdmit:
		// The RateLimit fields of ratelimit_headers: all, appended to
		// the upstream's response (none otherwise).
		hs, buf := st.info.answer.RenderAllow(st.hdrs[:0], st.buf[:0], &st.dec)
		st.buf = buf
		return exchange.Decision{Allow: true, Header: hs, Forward: st.fwd, State: st}
	case admission.ActionDeny:
		a := st.info.answer
		hs, buf, body := a.RenderDecision(st.hdrs[:0], st.buf[:0], &st.dec)
		st.buf = buf
		if len(st.rid) > 0 {
			hs = append(hs, httpparse.Header{Name: st.gen.ridName, Value: st.rid})
		}
		return exchange.Decision{Status: a.Status, Header: hs, Body: body, ContentType: a.ContentType, State: st}
	case admission.ActionDrop:
		// The client is gone; whatever is written is never read.
		return exchange.Decision{Status: statusClientClosed, State: st}
	}
	return exchange.Decision{Status: 500, Body: internalBody, ContentType: "text/plain; charset=utf-8", State: st}
}

// Check implements admission.Checker for the request's Engine: it asks
// the request's checker (the proxy cancels ctx when the client goes
// away).
func (st *state) Check(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	st.ref.c.Check(ctx, req, out)
}

// Report implements admission.Checker (the Engine never reports).
func (st *state) Report(service []byte, d time.Duration) { st.ref.c.Report(service, d) }

// statusClientClosed is nginx's 499 "client closed request": the status
// of a request whose client went away during admission (never written).
const statusClientClosed = 499

// Done implements exchange.Hook: report, count, log, release.
func (g *Gate) Done(r *exchange.Request, d *exchange.Decision, res *exchange.Result) {
	st, _ := d.State.(*state)
	if st == nil {
		return
	}
	dec := &st.dec
	outcome := dec.Outcome
	switch {
	case res.AdmissionErr != nil:
		// The proxy stopped waiting for the decision and answered 503
		// itself (Config.AdmissionTimeout): its failure, not the client's.
		outcome = admission.OutcomeInternalError
	case res.ClientAborted:
		outcome = admission.OutcomeClientAbort
	}
	loc := dec.Location
	reported := false
	if loc != nil && loc.Report != nil && admission.ShouldReport(true, dec.Outcome, d.Allow, res.ClientAborted) {
		end := res.End
		if end.IsZero() {
			end = g.now()
		}
		var err error
		st.report, err = loc.Report.Service.Render(st.report[:0], &st.areq)
		if err == nil && len(st.report) > 0 && len(st.report) <= admission.MaxBucketLen {
			st.ref.c.Report(st.report, admission.ReportDuration(end.Sub(r.Start)))
			reported = true
		}
	}
	if info := st.info; info != nil {
		info.m.Requests[outcome].Inc()
		if loc != nil && loc.Protected() {
			info.m.Admission.Observe(dec.Admission.Seconds())
		}
		if reported {
			info.m.Reports.Inc()
		}
		if res.UpstreamErr != nil {
			info.m.Upstream.Inc()
		}
		if !d.Allow && (dec.Action == admission.ActionDeny) {
			info.m.Deny.Inc()
		}
		if int(dec.Cause) < len(g.causes) {
			g.causes[dec.Cause].Inc()
		}
		countDenials(info, dec)
		if len(info.top) > 0 {
			at := r.Start
			if at.IsZero() {
				at = g.now()
			}
			recordTop(info, dec, at.UnixNano())
		}
		if dec.Local {
			g.m.LocalFallback(dec.LocalAllowed)
			g.warnLocal(dec.Cause)
		}
	}
	if st.gen != nil && st.gen.pol.RateLimitly.Debug && dec.Location != nil && dec.Location.Protected() {
		g.logDecision(st)
	}
	// Checked here as well as in logAccess: its frame (the access line's
	// attributes, ~3 KB) would otherwise be entered on every request, and
	// on an HTTP/2 stream's goroutine that made its stack grow (a copy)
	// per request even with the access log off.
	if g.access.Enabled(context.Background(), slog.LevelInfo) {
		g.logAccess(r, d, res, st, outcome, reported)
	}
	g.release(st.ref)
	st.ref, st.gen, st.info = nil, nil, nil
	st.areq = admission.Request{}
	g.pool.Put(st)
}

// localWarnEvery bounds the fail: local warning to one per interval.
const localWarnEvery = 10 * time.Second

// warnLocal says, at most once per localWarnEvery, that decisions are
// being taken by the local token buckets.
func (g *Gate) warnLocal(c ratelimitly.Cause) {
	now := g.now().UnixNano()
	last := g.lastLocalWarn.Load()
	if now-last < int64(localWarnEvery) || !g.lastLocalWarn.CompareAndSwap(last, now) {
		return
	}
	g.log.Warn("RateLimitly unusable: deciding with the local token buckets of this node (fail: local)", "cause", c.String())
}

// logDecision is the debug decision log (`ratelimitly: {debug: true}` and
// --log-level debug): what was asked and what RateLimitly answered.
func (g *Gate) logDecision(st *state) {
	if !g.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	dec := &st.dec
	attrs := []slog.Attr{
		slog.String("service", st.svc), slog.String("location", st.info.name),
		slog.String("verdict", dec.Verdict.String()), slog.String("cause", dec.Cause.String()),
		slog.String("label", string(dec.Req.Label)),
	}
	for i, rs := range dec.Req.Resources {
		a := []any{slog.String("bucket", string(rs.Bucket)), slog.Uint64("rate", uint64(rs.Rate)), slog.Uint64("period_ms", uint64(rs.PeriodMs)), slog.Uint64("burst", uint64(rs.Burst))}
		if dec.Result.Valid && i < len(dec.Result.Resp.Resources) {
			rr := dec.Result.Resp.Resources[i]
			a = append(a, slog.Uint64("remaining", uint64(rr.Remaining)), slog.Uint64("tokens_deficit", uint64(rr.TokensDeficit)), slog.Uint64("retry_after_ms", uint64(rr.RetryAfterMs)))
		}
		attrs = append(attrs, slog.Group(fmt.Sprintf("resource%d", i), a...))
	}
	for i, gd := range dec.Req.Guards {
		a := []any{slog.String("service", string(gd.Service)), slog.Uint64("threshold_ms", uint64(gd.ThresholdMs))}
		if dec.Result.Valid && i < len(dec.Result.Resp.Guards) {
			gr := dec.Result.Resp.Guards[i]
			a = append(a, slog.Bool("passed", gr.Passed), slog.Uint64("observed_ms", uint64(gr.ObservedMs)))
		}
		attrs = append(attrs, slog.Group(fmt.Sprintf("guard%d", i), a...))
	}
	if dec.Result.Valid {
		attrs = append(attrs, slog.Uint64("server_epoch", dec.Result.Resp.ServerEpoch))
	}
	if dec.Local {
		attrs = append(attrs, slog.Bool("local_allowed", dec.LocalAllowed))
	}
	g.log.LogAttrs(context.Background(), slog.LevelDebug, "decision", attrs...)
}
