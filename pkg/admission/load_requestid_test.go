package admission

import (
	"errors"
	"strings"
	"testing"
)

func TestLoadRequestID(t *testing.T) {
	for _, c := range []struct {
		name, block string
		want        RequestID
	}{
		{"default", "", RequestID{Header: "X-Request-ID", Generate: true}},
		{"renamed", "request_id: {header: X-Correlation-Id}\n", RequestID{Header: "X-Correlation-Id", Generate: true}},
		{"pass through only", "request_id:\n  generate: false\n", RequestID{Header: "X-Request-ID", Generate: false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := ptLoad(t, ptEmbedded+c.block+ptService)
			if p.RequestID != c.want {
				t.Fatalf("RequestID %+v, want %+v", p.RequestID, c.want)
			}
		})
	}
}

func TestLoadRequestIDErrors(t *testing.T) {
	for _, c := range []struct {
		name, block, want string
	}{
		{"space in name", "request_id: {header: \"X Request\"}\n", `2: request_id.header: "X Request" is not an HTTP field name`},
		{"empty name", "request_id: {header: \"\"}\n", `2: request_id.header: "" is not an HTTP field name`},
		{"too long", "request_id: {header: " + strings.Repeat("x", 65) + "}\n", "2: request_id.header: "},
		{"reserved", "request_id: {header: content-length}\n", "2: request_id.header: content-length is a field the proxy sets or drops itself"},
		{"traceparent", "request_id: {header: Traceparent}\n", "2: request_id.header: Traceparent is a field the proxy sets or drops itself"},
		{"unknown key", "request_id: {format: uuid}\n", `2: request_id: unknown key "format"`},
		{"not a bool", "request_id: {generate: maybe}\n", "2: request_id.generate: want true or false"},
		{"not a mapping", "request_id: X-Request-ID\n", "2: request_id: want a mapping"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(ptWrite(t, ptEmbedded+c.block+ptService, ""))
			var le *LoadError
			if !errors.As(err, &le) || len(le.Errs) != 1 {
				t.Fatalf("err %v, want one error", err)
			}
			if got := le.Errs[0].Error(); !strings.Contains(got, c.want) {
				t.Fatalf("error %q, want %q", got, c.want)
			}
		})
	}
}
