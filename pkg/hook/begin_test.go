package hook

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// viaBegin makes the tests drive the Gate through Begin and Cancel (the
// event-loop path's AsyncHook) instead of Admit. TestViaBegin sets it and
// runs the package's tests again.
var viaBegin bool

// hookFor is the Hook a test's proxy gets: the Gate itself, or the Gate
// driven through Begin.
func hookFor(g *Gate) exchange.Hook {
	if viaBegin {
		return beginHook{g}
	}
	return g
}

// admitVia admits r through Admit or, under viaBegin, through Begin.
func admitVia(g *Gate, ctx context.Context, r *exchange.Request) exchange.Decision {
	if viaBegin {
		return admitBegin(g, ctx, r)
	}
	return g.Admit(ctx, r)
}

// beginHook is the Gate whose Admit does what the event-loop path does
// with an AsyncHook: Begin, then wait for Resume, and Cancel when the
// client goes away (Admit's ctx). Every other method is the
// Gate's.
type beginHook struct{ *Gate }

func (b beginHook) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	return admitBegin(b.Gate, ctx, r)
}

// Contract violations seen by resumeWaiter: a second Resume, or a Resume
// after Begin returned true. TestViaBegin fails on any.
var extraResumes, resumesAfterDecided atomic.Int64

type resumeWaiter struct {
	ch      chan struct{}
	n       atomic.Int32
	decided atomic.Bool
}

func (w *resumeWaiter) Resume() {
	if w.decided.Load() {
		resumesAfterDecided.Add(1)
	}
	if w.n.Add(1) > 1 {
		extraResumes.Add(1)
		return
	}
	w.ch <- struct{}{}
}

func admitBegin(g *Gate, ctx context.Context, r *exchange.Request) exchange.Decision {
	var d exchange.Decision
	w := &resumeWaiter{ch: make(chan struct{}, 1)}
	if g.Begin(r, &d, w) {
		w.decided.Store(true)
		if w.n.Load() != 0 {
			resumesAfterDecided.Add(1)
		}
		return d
	}
	select {
	case <-w.ch:
	case <-ctx.Done():
		g.Cancel(r)
		<-w.ch
	}
	return d
}

// notTwice are the tests TestViaBegin does not run again: the ones that
// test Begin already, and TestMain.
var notTwice = []string{"TestMain", "TestViaBegin"}

// TestViaBegin runs the package's tests with the Gate driven through
// Begin: everything Admit does (decisions, metrics, access fields,
// reports in Done, shadow, watching) must be the same.
func TestViaBegin(t *testing.T) {
	tests := []struct {
		name string
		f    func(*testing.T)
	}{
		{"TestAccessLineAllowed", TestAccessLineAllowed},
		{"TestAccessLineCombined", TestAccessLineCombined},
		{"TestAccessLineDenied", TestAccessLineDenied},
		{"TestAdmissionTimeoutIsInternalError", TestAdmissionTimeoutIsInternalError},
		{"TestAllowPassesUpstreamRateLimitUnchanged", TestAllowPassesUpstreamRateLimitUnchanged},
		{"TestAllowRateLimitFieldsThroughProxy", TestAllowRateLimitFieldsThroughProxy},
		{"TestClientAbortNoReport", TestClientAbortNoReport},
		{"TestClientAbortUnprotectedReportNoReport", TestClientAbortUnprotectedReportNoReport},
		{"TestClientAddressNamesRequestRemote", TestClientAddressNamesRequestRemote},
		{"TestClientAbortWaitingForUpstreamNoReport", TestClientAbortWaitingForUpstreamNoReport},
		{"TestDebugDecisionLog", TestDebugDecisionLog},
		{"TestDenyAnswer", TestDenyAnswer},
		{"TestDoneDoesNotWaitForCheckerClose", TestDoneDoesNotWaitForCheckerClose},
		{"TestFailCloseAnswerSaysSo", TestFailCloseAnswerSaysSo},
		{"TestGateTLSConnection", TestGateTLSConnection},
		{"TestInvalidDenyThroughProxy", TestInvalidDenyThroughProxy},
		{"TestLocalFallbackLogsAndCounts", TestLocalFallbackLogsAndCounts},
		{"TestMatchOnNormalizedPath", TestMatchOnNormalizedPath},
		{"TestProxyServicesAdmissionTimeout", TestProxyServicesAdmissionTimeout},
		{"TestRejectionsCountedAndLogged", TestRejectionsCountedAndLogged},
		{"TestReportRulesThroughProxy", TestReportRulesThroughProxy},
		{"TestRequestIDGeneratedUpstream", TestRequestIDGeneratedUpstream},
		{"TestRequestIDPolicy", TestRequestIDPolicy},
		{"TestSetCheckerDrainsOld", TestSetCheckerDrainsOld},
		{"TestSwapInflightKeepsGeneration", TestSwapInflightKeepsGeneration},
		{"TestSwapLogsPolicyWarnings", TestSwapLogsPolicyWarnings},
		{"TestSwapPrunesRemovedSeries", TestSwapPrunesRemovedSeries},
		{"TestTopFromDone", TestTopFromDone},
		{"TestTopRetainOnSwap", TestTopRetainOnSwap},
	}
	// Every test of the package is in the list (or in notTwice, or
	// tests Begin itself), so a new test runs both ways.
	names := testFuncs(t)
	for _, n := range names {
		listed := slices.ContainsFunc(tests, func(tc struct {
			name string
			f    func(*testing.T)
		}) bool {
			return tc.name == n
		})
		if !listed && !slices.Contains(notTwice, n) && !strings.HasPrefix(n, "TestBegin") &&
			!strings.Contains(n, "Alloc") { // allocation tests cover both paths themselves
			t.Errorf("%s is not run through Begin: add it to TestViaBegin", n)
		}
	}
	viaBegin = true
	t.Cleanup(func() { viaBegin = false })
	extraResumes.Store(0)
	resumesAfterDecided.Store(0)
	for _, tc := range tests {
		t.Run(tc.name, tc.f)
	}
	if n := extraResumes.Load(); n != 0 {
		t.Errorf("%d requests resumed more than once", n)
	}
	if n := resumesAfterDecided.Load(); n != 0 {
		t.Errorf("%d requests decided by Begin were also resumed", n)
	}
}

// testFuncs lists the Test functions of this package's test files.
func testFuncs(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				out = append(out, fd.Name.Name)
			}
		}
	}
	return out
}
