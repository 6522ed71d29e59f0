package exchange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAdmissionTimeoutError: the one error every path wraps is what
// errors.Is finds, is the end of Admit's context and a timeout, and
// names the bound that passed.
func TestAdmissionTimeoutError(t *testing.T) {
	err := AdmissionTimeoutError(1500 * time.Millisecond)
	if !errors.Is(err, ErrAdmissionTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v: not ErrAdmissionTimeout and context.DeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%v: not a timeout", err)
	}
	if !strings.Contains(err.Error(), "1.5s") {
		t.Fatalf("%q does not name the bound", err)
	}
	for _, other := range []error{context.DeadlineExceeded, context.Canceled, fmt.Errorf("dial: %w", context.DeadlineExceeded)} {
		if errors.Is(other, ErrAdmissionTimeout) {
			t.Fatalf("%v counts as an admission timeout", other)
		}
	}
}
