package wire

import "encoding/binary"

// Guard asks whether the latency estimate of Service is at or under
// ThresholdMs.
type Guard struct {
	Service     []byte
	ThresholdMs uint32
}

// Resource asks to consume Cost tokens from the token bucket Bucket, whose
// capacity is Burst (Rate when Burst is 0) and which refills Rate tokens
// per PeriodMs milliseconds.
type Resource struct {
	Bucket   []byte
	Rate     uint32
	PeriodMs uint32
	Burst    uint32
	Cost     uint32
}

// RateRequest is the body of a RATE_REQUEST (and the tail of a COMPLETION).
type RateRequest struct {
	Label     []byte // empty = no label
	Guards    []Guard
	Resources []Resource
}

// GuardResult answers one Guard, in request order.
type GuardResult struct {
	Passed     bool
	ObservedMs uint32
}

// ResourceResult answers one Resource, in request order.
type ResourceResult struct {
	Remaining     uint32
	TokensDeficit uint32
	RetryAfterMs  uint32
}

// RateResponse is the body of a RATE_RESPONSE.
type RateResponse struct {
	Status      uint8
	Success     bool
	ServerEpoch uint64 // server start, unix ms
	Guards      []GuardResult
	Resources   []ResourceResult
}

// ReportEntry is one latency sample.
type ReportEntry struct {
	Service    []byte
	DurationMs uint32
}

// LatencyReport is the body of a LATENCY_REPORT.
type LatencyReport struct {
	Entries []ReportEntry
}

// Completion is the body of a COMPLETION: the client's decision and the
// original request.
type Completion struct {
	Decision uint8 // DecisionAllow or DecisionDeny
	Request  RateRequest
}

// Body is implemented by the four body types.
type Body interface {
	// Kind is the header kind that carries this body.
	Kind() Kind
	// AppendBody appends the plaintext encoding to dst. It fails (and dst
	// is unchanged in length) when a field is out of bounds.
	AppendBody(dst []byte) ([]byte, error)
	// DecodeBody parses a whole plaintext body, reusing the receiver's slices.
	DecodeBody(b []byte) error
}

// Kind implements Body.
func (*RateRequest) Kind() Kind { return KindRateRequest }

// Kind implements Body.
func (*RateResponse) Kind() Kind { return KindRateResponse }

// Kind implements Body.
func (*LatencyReport) Kind() Kind { return KindLatencyReport }

// Kind implements Body.
func (*Completion) Kind() Kind { return KindCompletion }

// Reset empties r keeping its slices' capacity.
func (r *RateRequest) Reset() {
	r.Label = nil
	r.Guards = r.Guards[:0]
	r.Resources = r.Resources[:0]
}

// Validate checks counts and string bounds without encoding.
func (r *RateRequest) Validate() error {
	if len(r.Guards) > MaxCount || len(r.Resources) > MaxCount {
		return ErrCount
	}
	if len(r.Label) > MaxLabel {
		return ErrStringTooLong
	}
	for i := range r.Guards {
		if err := checkName(r.Guards[i].Service); err != nil {
			return err
		}
	}
	for i := range r.Resources {
		if err := checkName(r.Resources[i].Bucket); err != nil {
			return err
		}
	}
	return nil
}

// EncodedLen is the plaintext body length of r (valid only if Validate passes).
func (r *RateRequest) EncodedLen() int {
	n := 2 + 2 + len(r.Label)
	for i := range r.Guards {
		n += 2 + len(r.Guards[i].Service) + 4
	}
	for i := range r.Resources {
		n += 2 + len(r.Resources[i].Bucket) + 16
	}
	return n
}

func checkName(b []byte) error {
	if len(b) == 0 {
		return ErrStringEmpty
	}
	if len(b) > MaxName {
		return ErrStringTooLong
	}
	return nil
}

// AppendBody implements Body.
func (r *RateRequest) AppendBody(dst []byte) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return dst, err
	}
	if r.EncodedLen() > MaxBody {
		return dst, ErrTooLarge
	}
	return r.appendUnchecked(dst), nil
}

func (r *RateRequest) appendUnchecked(dst []byte) []byte {
	dst = append(dst, byte(len(r.Guards)), byte(len(r.Resources)))
	dst = appendString(dst, r.Label)
	for i := range r.Guards {
		g := &r.Guards[i]
		dst = appendString(dst, g.Service)
		dst = binary.BigEndian.AppendUint32(dst, g.ThresholdMs)
	}
	for i := range r.Resources {
		rs := &r.Resources[i]
		dst = appendString(dst, rs.Bucket)
		dst = binary.BigEndian.AppendUint32(dst, rs.Rate)
		dst = binary.BigEndian.AppendUint32(dst, rs.PeriodMs)
		dst = binary.BigEndian.AppendUint32(dst, rs.Burst)
		dst = binary.BigEndian.AppendUint32(dst, rs.Cost)
	}
	return dst
}

func appendString(dst, s []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// DecodeBody implements Body.
func (r *RateRequest) DecodeBody(b []byte) error {
	if len(b) > MaxBody {
		return ErrTooLarge
	}
	d := decoder{b: b}
	if err := r.decode(&d); err != nil {
		return err
	}
	return d.end()
}

func (r *RateRequest) decode(d *decoder) error {
	ng, nr := d.u8(), d.u8()
	if d.err != nil {
		return d.err
	}
	if ng > MaxCount || nr > MaxCount {
		return ErrCount
	}
	r.Label = d.str(MaxLabel, true)
	r.Guards = r.Guards[:0]
	for i := 0; i < int(ng) && d.err == nil; i++ {
		s := d.str(MaxName, false)
		r.Guards = append(r.Guards, Guard{Service: s, ThresholdMs: d.u32()})
	}
	r.Resources = r.Resources[:0]
	for i := 0; i < int(nr) && d.err == nil; i++ {
		s := d.str(MaxName, false)
		r.Resources = append(r.Resources, Resource{Bucket: s, Rate: d.u32(), PeriodMs: d.u32(), Burst: d.u32(), Cost: d.u32()})
	}
	return d.err
}

// Reset empties r keeping its slices' capacity.
func (r *RateResponse) Reset() {
	*r = RateResponse{Guards: r.Guards[:0], Resources: r.Resources[:0]}
}

// AppendBody implements Body.
func (r *RateResponse) AppendBody(dst []byte) ([]byte, error) {
	if len(r.Guards) > MaxCount || len(r.Resources) > MaxCount {
		return dst, ErrCount
	}
	if r.Status > StatusUnavailable {
		return dst, ErrValue
	}
	dst = append(dst, r.Status, b2u(r.Success))
	dst = binary.BigEndian.AppendUint64(dst, r.ServerEpoch)
	dst = append(dst, byte(len(r.Guards)), byte(len(r.Resources)))
	for i := range r.Guards {
		dst = append(dst, b2u(r.Guards[i].Passed))
		dst = binary.BigEndian.AppendUint32(dst, r.Guards[i].ObservedMs)
	}
	for i := range r.Resources {
		rs := &r.Resources[i]
		dst = binary.BigEndian.AppendUint32(dst, rs.Remaining)
		dst = binary.BigEndian.AppendUint32(dst, rs.TokensDeficit)
		dst = binary.BigEndian.AppendUint32(dst, rs.RetryAfterMs)
	}
	return dst, nil
}

// DecodeBody implements Body.
func (r *RateResponse) DecodeBody(b []byte) error {
	if len(b) > MaxBody {
		return ErrTooLarge
	}
	d := decoder{b: b}
	r.Status = d.u8()
	succ := d.u8()
	r.ServerEpoch = d.u64()
	ng, nr := d.u8(), d.u8()
	if d.err != nil {
		return d.err
	}
	if r.Status > StatusUnavailable || succ > 1 {
		return ErrValue
	}
	r.Success = succ == 1
	if ng > MaxCount || nr > MaxCount {
		return ErrCount
	}
	// Fixed-size entries: check the exact length up front.
	if want := int(ng)*5 + int(nr)*12; len(d.b) != want {
		if len(d.b) < want {
			return ErrTruncated
		}
		return ErrTrailing
	}
	r.Guards = r.Guards[:0]
	for i := 0; i < int(ng); i++ {
		p := d.u8()
		if p > 1 {
			return ErrValue
		}
		r.Guards = append(r.Guards, GuardResult{Passed: p == 1, ObservedMs: d.u32()})
	}
	r.Resources = r.Resources[:0]
	for i := 0; i < int(nr); i++ {
		r.Resources = append(r.Resources, ResourceResult{Remaining: d.u32(), TokensDeficit: d.u32(), RetryAfterMs: d.u32()})
	}
	return d.end()
}

// Reset empties r keeping its slice's capacity.
func (r *LatencyReport) Reset() { r.Entries = r.Entries[:0] }

// AppendBody implements Body.
func (r *LatencyReport) AppendBody(dst []byte) ([]byte, error) {
	if len(r.Entries) == 0 || len(r.Entries) > MaxCount {
		return dst, ErrCount
	}
	n := 1
	for i := range r.Entries {
		if err := checkName(r.Entries[i].Service); err != nil {
			return dst, err
		}
		n += 2 + len(r.Entries[i].Service) + 4
	}
	if n > MaxBody {
		return dst, ErrTooLarge
	}
	dst = append(dst, byte(len(r.Entries)))
	for i := range r.Entries {
		dst = appendString(dst, r.Entries[i].Service)
		dst = binary.BigEndian.AppendUint32(dst, r.Entries[i].DurationMs)
	}
	return dst, nil
}

// DecodeBody implements Body.
func (r *LatencyReport) DecodeBody(b []byte) error {
	if len(b) > MaxBody {
		return ErrTooLarge
	}
	d := decoder{b: b}
	n := d.u8()
	if d.err != nil {
		return d.err
	}
	if n == 0 || n > MaxCount {
		return ErrCount
	}
	r.Entries = r.Entries[:0]
	for i := 0; i < int(n) && d.err == nil; i++ {
		s := d.str(MaxName, false)
		r.Entries = append(r.Entries, ReportEntry{Service: s, DurationMs: d.u32()})
	}
	if d.err != nil {
		return d.err
	}
	return d.end()
}

// AppendBody implements Body.
func (c *Completion) AppendBody(dst []byte) ([]byte, error) {
	if c.Decision != DecisionAllow && c.Decision != DecisionDeny {
		return dst, ErrValue
	}
	if err := c.Request.Validate(); err != nil {
		return dst, err
	}
	if 1+c.Request.EncodedLen() > MaxBody {
		return dst, ErrTooLarge
	}
	dst = append(dst, c.Decision)
	return c.Request.appendUnchecked(dst), nil
}

// DecodeBody implements Body.
func (c *Completion) DecodeBody(b []byte) error {
	if len(b) > MaxBody {
		return ErrTooLarge
	}
	d := decoder{b: b}
	c.Decision = d.u8()
	if d.err != nil {
		return d.err
	}
	if c.Decision != DecisionAllow && c.Decision != DecisionDeny {
		return ErrValue
	}
	if err := c.Request.decode(&d); err != nil {
		return err
	}
	return d.end()
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// decoder reads big-endian fields; the first error sticks and later reads
// return zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if len(d.b) < n {
		d.err = ErrTruncated
		return false
	}
	return true
}

func (d *decoder) u8() uint8 {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// str reads a u16-length string of at most max bytes; empty is allowed only
// when emptyOK.
func (d *decoder) str(max int, emptyOK bool) []byte {
	if !d.need(2) {
		return nil
	}
	n := int(binary.BigEndian.Uint16(d.b))
	if n > max {
		d.err = ErrStringTooLong
		return nil
	}
	if n == 0 && !emptyOK {
		d.err = ErrStringEmpty
		return nil
	}
	if !d.need(2 + n) {
		return nil
	}
	s := d.b[2 : 2+n : 2+n]
	d.b = d.b[2+n:]
	if n == 0 {
		return nil
	}
	return s
}

func (d *decoder) end() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return ErrTrailing
	}
	return nil
}
