package hook

import (
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// The policy's timeouts.admission reaches the proxy's service, which
// applies it (and a reload's Update swaps it).
func TestProxyServicesAdmissionTimeout(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", admission.DefaultAdmissionTimeout},
		{"    timeouts: {admission: 2s}\n", 2 * time.Second},
	} {
		pol, err := admission.Parse("policy.yaml", []byte("ratelimitly: {embedded: true}\nservices:\n  - name: web\n    listen: 127.0.0.1:8080\n    upstream: 127.0.0.1:8081\n"+tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := ProxyServices(pol)[0].AdmissionTimeout; got != tc.want {
			t.Errorf("%q: proxy service admission timeout %v, want %v", tc.yaml, got, tc.want)
		}
	}
}
