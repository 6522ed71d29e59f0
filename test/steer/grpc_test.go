package steer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rl-tproxy/rl-tproxy/internal/grpctest"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

const grpcPort = 50051

// TestSteerGRPC: an unchanged gRPC server (grpc-go, h2c) listens on port
// 50051 in the node namespace; the proxy steers that port. A grpc-go
// client in the client namespace calls the server's own address: unary,
// server, client and bidirectional streaming calls pass through the
// proxy; the unary location's burst admits 3 calls and the 4th ends with
// RESOURCE_EXHAUSTED naming the zone, with a pushback; every admitted
// stream sends one latency report (access lines and the reports metric);
// the denied call never reaches the server.
func TestSteerGRPC(t *testing.T) {
	e := newEnv(t, false)
	var ln net.Listener
	if err := e.pair.Node.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", grpcPort))
		return err
	}); err != nil {
		t.Fatalf("gRPC server in the node namespace: %v", err)
	}
	up, stop := grpctest.Serve(ln)
	t.Cleanup(stop)

	e.policy = filepath.Join(e.dir, "grpc-policy.yaml")
	body := fmt.Sprintf(`ratelimitly:
  srv: %s
  resolver: %s
  credentials: %s
  request_policy: {name: standard, unit: 250ms}
  fail: close
zones:
  calls: {bucket: "grpc:{remote_addr}", rate: 1/m, burst: 3}
trackers:
  lat: {service: "grpc:{path}"}
services:
  - name: grpc
    port: %d
    upstream: "127.0.0.1:%d"
    report: lat
    locations:
      - name: unary
        match: {path: /grpc.testing.TestService/UnaryCall}
        limit: [calls]
      - name: streams
        match: {path_prefix: /grpc.testing.TestService/}
`, srvName, e.dns.Addr, filepath.Join(e.dir, "credentials.yaml"), grpcPort, grpcPort)
	if err := os.WriteFile(e.policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	px := e.startProxy(proxyName)

	target := netip.AddrPortFrom(e.nodeIP, grpcPort).String()
	cc, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var c net.Conn
			err := e.pair.Client.Do(func() error { // dial from the client namespace
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, "tcp", addr)
				return err
			})
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := testgrpc.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := grpctest.CallKinds(ctx, cl); err != nil { // 1 unary + 3 streams
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		if _, err := cl.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Fatalf("unary call %d of the burst: %v", i, err)
		}
	}
	var trl metadata.MD
	_, err = cl.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.Trailer(&trl))
	if s, _ := status.FromError(err); s.Code() != codes.ResourceExhausted || s.Message() != "rate limited by zone calls" {
		t.Fatalf("call after the burst: %v, want RESOURCE_EXHAUSTED naming zone calls", err)
	}
	if pb, _ := strconv.Atoi(first(trl.Get("grpc-retry-pushback-ms"))); pb < 1000 {
		t.Fatalf("pushback %q, want whole seconds in ms (trailer %v)", trl.Get("grpc-retry-pushback-ms"), trl)
	}
	if n := up.Calls(); n != 3 {
		t.Fatalf("the gRPC server saw %d unary calls, want the 3 admitted", n)
	}

	// 6 admitted streams (3 unary, 3 streaming), each reported once; the
	// deny is not reported.
	admitted, reported := 0, 0
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range px.access() {
				t.Logf("access: %v", m)
			}
		}
	})
	testkit.WaitFor(t, "7 h2 access lines", func() bool {
		admitted, reported = 0, 0
		n := 0
		for _, m := range px.access() {
			if m["proto"] != "h2" {
				continue
			}
			n++
			if m["verdict"] != "deny" && m["outcome"] != "deny" {
				admitted++
			}
			if m["report"] == true {
				reported++
			}
		}
		return n == 7
	})
	if admitted != 6 || reported != 6 {
		t.Fatalf("access lines: %d admitted, %d reported; want 6 and 6", admitted, reported)
	}
	re := regexp.MustCompile(`(?m)^rl_tproxy_latency_reports_total\{service="grpc"\} (\d+)`)
	var got string
	testkit.WaitFor(t, "the reports metric", func() bool {
		r, err := httpGet(e.pair.Node, px.admin, "/metrics", true)
		if err != nil {
			return false
		}
		if m := re.FindStringSubmatch(r.body); m != nil {
			got = m[1]
			return true
		}
		return false
	})
	if got != "6" {
		t.Fatalf("rl_tproxy_latency_reports_total{service=\"grpc\"} = %s, want 6", got)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
