// Package grpctest is the gRPC test peer of the HTTP/2 tests: an upstream
// implementing grpc-go's interop TestService (unary echo, server, client
// and bidirectional streaming, requested error statuses) and a client
// routine that makes one call of each kind.
package grpctest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Echo is the upstream service.
type Echo struct {
	testgrpc.UnimplementedTestServiceServer
	mu     sync.Mutex
	lastMD metadata.MD
	calls  int
	// Block, when set before a UnaryCall, makes it wait for its context
	// to end and then close Block (the test sees the upstream reset).
	Block chan struct{}
}

// Calls is the number of UnaryCall calls received.
func (s *Echo) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// LastMD is the metadata of the last UnaryCall.
func (s *Echo) LastMD() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastMD
}

// UnaryCall echoes the payload and sets the trailer x-trailer: t1.
func (s *Echo) UnaryCall(ctx context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.lastMD, s.calls = md, s.calls+1
	block := s.Block
	s.mu.Unlock()
	if block != nil {
		<-ctx.Done()
		close(block)
		return nil, ctx.Err()
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t1"))
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: in.GetPayload().GetBody()}}, nil
}

// StreamingOutputCall sends one message per requested size.
func (s *Echo) StreamingOutputCall(in *testgrpc.StreamingOutputCallRequest, out grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for _, p := range in.GetResponseParameters() {
		if err := out.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: make([]byte, p.GetSize())}}); err != nil {
			return err
		}
	}
	return nil
}

// StreamingInputCall sums the payload sizes it receives.
func (s *Echo) StreamingInputCall(in grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	var sum int32
	for {
		m, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return in.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: sum})
		}
		if err != nil {
			return err
		}
		sum += int32(len(m.GetPayload().GetBody()))
	}
}

// FullDuplexCall answers each message with its payload, or ends with the
// status a message asks for.
func (s *Echo) FullDuplexCall(st grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if rs := m.GetResponseStatus(); rs != nil {
			return status.Error(codes.Code(rs.GetCode()), rs.GetMessage())
		}
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// Serve runs an Echo gRPC server (h2c prior knowledge) on ln until stop
// is called.
func Serve(ln net.Listener) (svc *Echo, stop func()) {
	svc = &Echo{}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, svc)
	go func() { _ = s.Serve(ln) }()
	return svc, s.Stop
}

// CallKinds makes one unary, one server-streaming, one client-streaming
// and one bidirectional call and checks their answers.
func CallKinds(ctx context.Context, cl testgrpc.TestServiceClient) error {
	if r, err := cl.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("u")}}); err != nil || string(r.GetPayload().GetBody()) != "u" {
		return fmt.Errorf("unary: %v %v", r, err)
	}
	ss, err := cl.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseParameters: []*testgrpc.ResponseParameters{{Size: 10}, {Size: 70000}}})
	if err != nil {
		return fmt.Errorf("server stream: %w", err)
	}
	var sizes []int
	for {
		m, err := ss.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("server stream: %w", err)
		}
		sizes = append(sizes, len(m.GetPayload().GetBody()))
	}
	if len(sizes) != 2 || sizes[0] != 10 || sizes[1] != 70000 {
		return fmt.Errorf("server stream: sizes %v", sizes)
	}
	cs, err := cl.StreamingInputCall(ctx)
	if err != nil {
		return fmt.Errorf("client stream: %w", err)
	}
	for _, n := range []int{4, 100000, 4} {
		if err := cs.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, n)}}); err != nil {
			return fmt.Errorf("client stream send: %w", err)
		}
	}
	if r, err := cs.CloseAndRecv(); err != nil || r.GetAggregatedPayloadSize() != 100008 {
		return fmt.Errorf("client stream: %v %v", r, err)
	}
	// Ping-pong: each answer arrives before the next message is sent.
	bs, err := cl.FullDuplexCall(ctx)
	if err != nil {
		return fmt.Errorf("bidi: %w", err)
	}
	for i := range 3 {
		if err := bs.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte{byte('a' + i)}}}); err != nil {
			return fmt.Errorf("bidi send: %w", err)
		}
		if m, err := bs.Recv(); err != nil || len(m.GetPayload().GetBody()) != 1 || m.GetPayload().GetBody()[0] != byte('a'+i) {
			return fmt.Errorf("bidi %d: %v %v", i, m, err)
		}
	}
	_ = bs.CloseSend()
	if _, err := bs.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("bidi end: %v", err)
	}
	return nil
}
