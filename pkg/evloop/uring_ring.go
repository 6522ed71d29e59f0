package evloop

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring kernel interface, by raw system calls (no cgo, no
// liburing): rings mapped into the process, SQEs filled in place.

const (
	sysIOUringSetup    = 425
	sysIOUringEnter    = 426
	sysIOUringRegister = 427

	opPollAdd     = 6
	opTimeout     = 11
	opAccept      = 13
	opAsyncCancel = 14
	opRead        = 22
	opSend        = 26
	opRecv        = 27

	setupCQSize       = 1 << 3
	setupSubmitAll    = 1 << 7
	setupSingleIssuer = 1 << 12
	setupCoopTaskrun  = 1 << 8
	setupTaskrunFlag  = 1 << 9

	sqCQOverflow = 1 << 1 // IORING_SQ_CQ_OVERFLOW
	sqTaskrun    = 1 << 2 // IORING_SQ_TASKRUN: completion work waits for the loop thread

	enterGetEvents = 1 << 0
	enterExtArg    = 1 << 3

	featSingleMmap = 1 << 0
	featNoDrop     = 1 << 1
	featExtArg     = 1 << 8

	recvMultishot   = 1 << 1
	pollAddMulti    = 1 << 0
	sqeBufferSelect = 1 << 5
	cancelAll       = 1 << 0
	cancelFD        = 1 << 1

	cqeFBuffer = 1 << 0
	cqeFMore   = 1 << 1

	regPbufRing = 22
	regEventfd  = 4

	cqEventfdDisabled = 1 << 0
	offSQEs           = 0x10000000

	pollIn  = 0x1
	pollOut = 0x4
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

type sqe struct {
	opcode   uint8
	flags    uint8
	ioprio   uint16
	fd       int32
	off      uint64
	addr     uint64
	len      uint32
	opFlags  uint32
	userData uint64
	bufGroup uint16
	pers     uint16
	spliceIn int32
	addr3    uint64
	pad      uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// getEventsArg is struct io_uring_getevents_arg (IORING_ENTER_EXT_ARG).
type getEventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	minWait   uint32
	ts        uint64
}

type ring struct {
	fd             int
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        unsafe.Pointer
	sqes           unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	cqFlags        *uint32
	sqFlags        *uint32
	sqEntries      uint32
	mem, sqeMem    []byte
	ts             unix.Timespec
	arg            getEventsArg
}

// ringFlags: the loop thread is the ring's only submitter (SINGLE_ISSUER);
// completion work (a socket's data arriving for a multishot recv, a
// poll firing) is task work for that thread, queued without an
// interrupt while it runs (COOP_TASKRUN: it runs at the thread's next
// entry into the kernel, the turn's enter) and waking it wherever it
// sleeps: in io_uring_enter, or parked in the Go runtime, where it posts
// the completions at once and signals the registered eventfd from its
// own context, which wakes the netpoller (see uring.parkFD).
//
// Not DEFER_TASKRUN: there completion work waits for the thread's next
// GETEVENTS enter, and the only wake-up of a thread that waits
// elsewhere is the registered eventfd, which the kernel (6.18 traced)
// signals from an RCU callback 4-20 ms after the data arrived: a parked
// loop would serve late (TestParkedLoopWakesAtOnce).
const ringFlags = setupSingleIssuer | setupCoopTaskrun | setupTaskrunFlag | setupSubmitAll | setupCQSize

// newRing sets a ring up for the calling thread (SINGLE_ISSUER: the loop
// thread is its only submitter).
func newRing(entries, cqEntries uint32) (*ring, error) {
	p := uringParams{flags: ringFlags, cqEntries: cqEntries}
	fd, _, e := unix.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", e)
	}
	r := &ring{fd: int(fd), sqEntries: p.sqEntries}
	need := uint32(featSingleMmap | featNoDrop | featExtArg)
	if p.features&need != need {
		r.close()
		return nil, fmt.Errorf("io_uring: kernel lacks features %#x (has %#x)", need, p.features)
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	mem, err := unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap io_uring rings: %w", err)
	}
	r.mem = mem
	sqeMem, err := unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap io_uring sqes: %w", err)
	}
	r.sqeMem = sqeMem
	base := unsafe.Pointer(&mem[0])
	r.sqHead = (*uint32)(unsafe.Add(base, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(base, p.sqOff.array)
	r.sqes = unsafe.Pointer(&sqeMem[0])
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Add(base, p.cqOff.cqes)
	r.cqFlags = (*uint32)(unsafe.Add(base, p.cqOff.flags))
	r.sqFlags = (*uint32)(unsafe.Add(base, p.sqOff.flags))
	return r, nil
}

func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.mem != nil {
		unix.Munmap(r.mem)
	}
	unix.Close(r.fd)
}

// unsubmitted is the number of queued SQEs the kernel has not consumed
// (it advances the head as it takes them), exact even after an enter
// that was interrupted.
func (r *ring) unsubmitted() uint32 { return *r.sqTail - atomic.LoadUint32(r.sqHead) }

// get returns the next free SQE, zeroed; when the queue is full it
// submits what is queued first.
func (r *ring) get() *sqe {
	for i := 0; r.unsubmitted() >= r.sqEntries; i++ {
		// Full: submit now. The kernel takes every SQE (SUBMIT_ALL) unless
		// it must first flush overflowed completions; then wait for one.
		if i > 0 {
			unix.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.unsubmitted()), 1, enterGetEvents, 0, 0)
		}
		r.submit()
	}
	tail := *r.sqTail
	idx := tail & r.sqMask
	s := (*sqe)(unsafe.Add(r.sqes, uintptr(idx)*unsafe.Sizeof(sqe{})))
	*s = sqe{}
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(idx)*4)) = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	return s
}

// submit hands the queued SQEs to the kernel without waiting (raw: it
// does not block). Errors are left to the turn's enter.
func (r *ring) submit() {
	for i := 0; i < 4 && r.unsubmitted() > 0; i++ {
		_, _, e := unix.RawSyscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.unsubmitted()), 0, enterGetEvents, 0, 0)
		if e != unix.EINTR {
			return
		}
	}
}

// enter submits what is queued and waits up to timeout ns for a
// completion (< 0: no bound, 0: no wait). The wait is announced to the
// scheduler unless raw (a bounded kernel wait holding the P, see
// kernelSpan).
func (r *ring) enter(timeout int64, raw bool) error {
	flags := uintptr(enterGetEvents)
	var minComplete, arg, argSz uintptr
	if timeout != 0 {
		minComplete = 1
	}
	if timeout > 0 {
		r.ts = unix.NsecToTimespec(timeout)
		r.arg = getEventsArg{ts: uint64(uintptr(unsafe.Pointer(&r.ts)))}
		flags |= enterExtArg
		arg, argSz = uintptr(unsafe.Pointer(&r.arg)), unsafe.Sizeof(r.arg)
	}
	var e unix.Errno
	if minComplete == 0 || raw {
		_, _, e = unix.RawSyscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.unsubmitted()), minComplete, flags, arg, argSz)
	} else {
		_, _, e = unix.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(r.unsubmitted()), minComplete, flags, arg, argSz)
	}
	switch e {
	case 0, unix.EINTR, unix.ETIME, unix.EAGAIN, unix.EBUSY:
		return nil // what was not submitted goes with the next enter
	}
	return fmt.Errorf("io_uring_enter: %w", e)
}

// registerEventfd has the kernel signal fd when completions are posted.
func (r *ring) registerEventfd(fd int) error {
	v := int32(fd)
	if _, _, e := unix.Syscall6(sysIOUringRegister, uintptr(r.fd), regEventfd, uintptr(unsafe.Pointer(&v)), 1, 0, 0); e != 0 {
		return fmt.Errorf("io_uring_register(EVENTFD): %w", e)
	}
	return nil
}

// eventfdEnabled turns the registered eventfd's signalling on or off
// (IORING_CQ_EVENTFD_DISABLED; only the loop thread writes the flags).
func (r *ring) eventfdEnabled(on bool) {
	f := atomic.LoadUint32(r.cqFlags)
	if on {
		f &^= cqEventfdDisabled
	} else {
		f |= cqEventfdDisabled
	}
	atomic.StoreUint32(r.cqFlags, f)
}

// pending reports whether the kernel holds completion work or overflowed
// completions that the next enter delivers (task work queued while the
// loop ran, which only its next entry into the kernel runs).
func (r *ring) pending() bool {
	return atomic.LoadUint32(r.sqFlags)&(sqTaskrun|sqCQOverflow) != 0
}

// cqe returns the completion at head, if any.
func (r *ring) peek(head uint32) *cqe {
	return (*cqe)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*unsafe.Sizeof(cqe{})))
}

// pbufRing is a registered ring of provided receive buffers: a multishot
// recv takes one only when data arrives, so an idle socket holds none.
type pbufRing struct {
	mem     []byte // the ring the kernel reads (page aligned, mmap)
	bufs    []byte // entries buffers of size bytes
	size    int
	entries uint16
	tail    uint16
	added   int // buffers returned since the last publish
}

func (r *ring) registerPbuf(entries uint16, size int) (*pbufRing, error) {
	mem, err := unix.Mmap(-1, 0, int(entries)*16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap buffer ring: %w", err)
	}
	// The buffers are mmap'd too, not Go memory: should the kernel write
	// into one after the ring is gone, it meets an unmapped page (EFAULT),
	// never memory the Go heap has reused.
	bufs, err := unix.Mmap(-1, 0, int(entries)*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("mmap receive buffers: %w", err)
	}
	p := &pbufRing{mem: mem, bufs: bufs, size: size, entries: entries}
	reg := struct {
		ringAddr    uint64
		ringEntries uint32
		bgid, flags uint16
		resv        [3]uint64
	}{ringAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), ringEntries: uint32(entries)}
	if _, _, e := unix.Syscall6(sysIOUringRegister, uintptr(r.fd), regPbufRing, uintptr(unsafe.Pointer(&reg)), 1, 0, 0); e != 0 {
		p.close()
		return nil, fmt.Errorf("io_uring_register(PBUF_RING): %w", e)
	}
	for i := uint16(0); i < entries; i++ {
		p.add(i)
	}
	p.publish()
	return p, nil
}

func (p *pbufRing) buf(bid uint16) []byte {
	return p.bufs[int(bid)*p.size : (int(bid)+1)*p.size]
}

// add queues buffer bid for the kernel; publish makes queued ones visible.
func (p *pbufRing) add(bid uint16) {
	e := unsafe.Pointer(&p.mem[int(p.tail&(p.entries-1))*16])
	*(*uint64)(e) = uint64(uintptr(unsafe.Pointer(&p.bufs[int(bid)*p.size])))
	*(*uint32)(unsafe.Add(e, 8)) = uint32(p.size)
	*(*uint16)(unsafe.Add(e, 12)) = bid
	p.tail++
	p.added++
}

// publish stores the tail (the u16 at offset 14 of the ring) with release
// order, as one 32-bit store together with entry 0's bid.
func (p *pbufRing) publish() {
	w := (*uint32)(unsafe.Pointer(&p.mem[12]))
	atomic.StoreUint32(w, uint32(*(*uint16)(unsafe.Pointer(&p.mem[12])))|uint32(p.tail)<<16)
	p.added = 0
}

func (p *pbufRing) close() {
	unix.Munmap(p.bufs)
	unix.Munmap(p.mem)
}

// uringSetupHook, when set (tests), runs instead of the kernel probe:
// its error stands for io_uring_setup refusing.
var uringSetupHook func() error

// ProbeIOUring reports whether this process may use io_uring as the
// loops need it: nil when Backend Auto would pick IOUring, else why the
// kernel or the seccomp profile refused it.
func ProbeIOUring() error { return probeUring() }

// probeUring reports whether this process may use io_uring as the loops
// need it (setup with the loop's flags and a provided-buffer ring).
func probeUring() error {
	if uringSetupHook != nil {
		return uringSetupHook()
	}
	runtime.LockOSThread() // SINGLE_ISSUER: set up and register on one thread
	defer runtime.UnlockOSThread()
	r, err := newRing(4, 8)
	if err != nil {
		return err
	}
	defer r.close()
	p, err := r.registerPbuf(2, 4096)
	if err != nil {
		return err
	}
	p.close()
	return nil
}
