package exchange

import (
	"context"
	"fmt"
	"time"
)

// ErrAdmissionTimeout is the error Result.AdmissionErr wraps on every
// path when the Hook gave no Decision within the admission timeout
// (Config.AdmissionTimeout): errors.Is(res.AdmissionErr,
// ErrAdmissionTimeout) holds for an HTTP/1.x request, an HTTP/2 stream
// and a TLS passthrough connection alike. It wraps
// context.DeadlineExceeded (the end of Admit's context), so it is also a
// timeout to net.Error's Timeout.
var ErrAdmissionTimeout = fmt.Errorf("admission deadline exceeded: %w", context.DeadlineExceeded)

// AdmissionTimeoutError is Result.AdmissionErr for a request whose
// admission had no Decision within d.
func AdmissionTimeoutError(d time.Duration) error {
	return fmt.Errorf("admission: no decision from the hook within %v: %w", d, ErrAdmissionTimeout)
}
