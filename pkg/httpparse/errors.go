package httpparse

import (
	"errors"
	"strconv"
)

// ErrNeedMore reports that the buffer holds an incomplete head (or chunk
// framing) that is so far valid and within limits: read more bytes and call
// again with the grown buffer.
var ErrNeedMore = errors.New("httpparse: need more data")

// Error is a strictness violation. Status is the HTTP status the proxy answers
// a client with (400, 414, 417, 431, 501, 505; for a response from upstream
// the proxy answers 502 instead), Rule names the violated rule (one distinct
// value per rule, stable, suitable for logs and metrics labels).
//
// Parse functions return the package-level *Error values below, so callers may
// compare with errors.Is or ==, or use errors.As to read Status and Rule.
type Error struct {
	Status int
	Rule   string
}

func (e *Error) Error() string {
	return "httpparse: " + e.Rule + " (" + strconv.Itoa(e.Status) + ")"
}

func newErr(status int, rule string) *Error { return &Error{Status: status, Rule: rule} }

// Request/status line.
var (
	ErrRequestLineTooLong = newErr(414, "request-line-too-long")
	ErrBadRequestLine     = newErr(400, "bad-request-line")    // wrong number of SP, empty parts
	ErrBadMethod          = newErr(400, "bad-method")          // method not a token
	ErrBadTarget          = newErr(400, "bad-target")          // byte or form not allowed in request-target
	ErrBadVersion         = newErr(400, "bad-version")         // not HTTP/DIGIT.DIGIT
	ErrVersionUnsupported = newErr(505, "version-unsupported") // well-formed, but not HTTP/1.0 or HTTP/1.1
	// Response-only rules carry 502: the proxy answers its client 502 Bad Gateway.
	ErrStatusLineTooLong = newErr(502, "status-line-too-long")
	ErrBadStatusLine     = newErr(502, "bad-status-line") // response: malformed status line
	ErrBadStatusCode     = newErr(502, "bad-status-code") // response: not 3 digits in 100..999
)

// Bytes and line structure.
var (
	ErrNUL    = newErr(400, "nul-byte")
	ErrBareCR = newErr(400, "bare-cr")
	ErrBareLF = newErr(400, "bare-lf")
)

// Header fields.
var (
	ErrHeaderTooBig          = newErr(431, "header-block-too-big")
	ErrTooManyHeaders        = newErr(431, "too-many-headers")
	ErrObsFold               = newErr(400, "obs-fold")
	ErrSpaceBeforeColon      = newErr(400, "space-before-colon")
	ErrBadHeaderName         = newErr(400, "bad-header-name") // non-token byte or empty name
	ErrMissingColon          = newErr(400, "header-missing-colon")
	ErrBadHeaderValue        = newErr(400, "bad-header-value") // control byte in a value
	ErrMissingHost           = newErr(400, "host-missing")
	ErrRepeatedHost          = newErr(400, "host-repeated")
	ErrBadHost               = newErr(400, "host-invalid")
	ErrBadContentLength      = newErr(400, "content-length-malformed") // sign, space, empty, non-digit, list
	ErrContentLengthOverflow = newErr(400, "content-length-overflow")
	ErrConflictingLength     = newErr(400, "content-length-conflict") // repeated with a different value
	ErrTEWithCL              = newErr(400, "transfer-encoding-with-content-length")
	ErrTEUnsupported         = newErr(501, "transfer-encoding-unsupported") // anything but exactly "chunked"
	ErrTERepeated            = newErr(501, "transfer-encoding-repeated")    // more than one Transfer-Encoding field
	ErrTEHTTP10              = newErr(400, "transfer-encoding-http10")
	ErrExpectUnsupported     = newErr(417, "expect-unsupported")          // Expect other than 100-continue (HTTP/1.1)
	ErrConnectionOptions     = newErr(400, "connection-options-too-many") // more than MaxConnectionOptions
)

// Chunked body framing.
var (
	ErrBadChunkSize      = newErr(400, "chunk-size-invalid")  // empty, non-hex, more than 16 digits
	ErrChunkSizeOverflow = newErr(400, "chunk-size-overflow") // > 2^63-1
	ErrBadChunkExt       = newErr(400, "chunk-extension-invalid")
	ErrChunkLineTooLong  = newErr(400, "chunk-line-too-long")
	ErrChunkMissingCRLF  = newErr(400, "chunk-missing-crlf") // data not followed by CRLF, or size line ended by bare LF
	ErrChunkOverhead     = newErr(400, "chunk-overhead")     // too much framing per byte of data
)

// AllErrors lists every rule error, for tests, documentation and metrics.
var AllErrors = []*Error{
	ErrRequestLineTooLong, ErrBadRequestLine, ErrBadMethod, ErrBadTarget, ErrBadVersion,
	ErrVersionUnsupported, ErrStatusLineTooLong, ErrBadStatusLine, ErrBadStatusCode,
	ErrNUL, ErrBareCR, ErrBareLF,
	ErrHeaderTooBig, ErrTooManyHeaders, ErrObsFold, ErrSpaceBeforeColon, ErrBadHeaderName,
	ErrMissingColon, ErrBadHeaderValue, ErrMissingHost, ErrRepeatedHost, ErrBadHost,
	ErrBadContentLength, ErrContentLengthOverflow, ErrConflictingLength, ErrTEWithCL,
	ErrTEUnsupported, ErrTERepeated, ErrTEHTTP10, ErrExpectUnsupported, ErrConnectionOptions,
	ErrBadChunkSize, ErrChunkSizeOverflow, ErrBadChunkExt, ErrChunkLineTooLong, ErrChunkMissingCRLF, ErrChunkOverhead,
	ErrTooManyInterims,
}
