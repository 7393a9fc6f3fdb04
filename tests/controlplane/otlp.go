package main

// controlplane otlp: an OpenTelemetry trace receiver for the tracing scenario. It serves the OTLP
// trace service over gRPC (what kube-apiserver's exporter speaks) and over HTTP (POST /v1/traces,
// protobuf or JSON: what the webhook's exporter speaks), from the protocol's own generated code
// (go.opentelemetry.io/proto/otlp, already in the apiserver's module graph), and writes one JSON
// line per span received to --out. It keeps nothing else: no batching, no sampling, no export.
//
//	controlplane otlp --grpc 127.0.0.1:0 --http 127.0.0.1:0 --out spans.jsonl
//
// Once both listen it prints "grpc=HOST:PORT http=HOST:PORT" on stdout.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func init() {
	register("otlp", runOTLP)
}

// spanLine is what the tests read: one span, with the service that sent it.
type spanLine struct {
	Service      string            `json:"service"`
	Name         string            `json:"name"`
	TraceID      string            `json:"traceId"`
	SpanID       string            `json:"spanId"`
	ParentSpanID string            `json:"parentSpanId"`
	Kind         string            `json:"kind"`
	StartNanos   uint64            `json:"startTimeUnixNano"`
	EndNanos     uint64            `json:"endTimeUnixNano"`
	Attributes   map[string]string `json:"attributes"`
	Via          string            `json:"via"`
}

type spanSink struct {
	mu  sync.Mutex
	out *os.File
}

func (s *spanSink) write(req *collectortrace.ExportTraceServiceRequest, via string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, kv := range sp.GetAttributes() {
					attrs[kv.GetKey()] = text(kv.GetValue())
				}
				line, err := json.Marshal(spanLine{
					Service:      service,
					Name:         sp.GetName(),
					TraceID:      hex.EncodeToString(sp.GetTraceId()),
					SpanID:       hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Kind:         sp.GetKind().String(),
					StartNanos:   sp.GetStartTimeUnixNano(),
					EndNanos:     sp.GetEndTimeUnixNano(),
					Attributes:   attrs,
					Via:          via,
				})
				if err != nil {
					return err
				}
				if _, err := s.out.Write(append(line, '\n')); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// text is an attribute's value as a string: strings as they are, numbers and booleans in Go's
// formatting, anything else as OTLP's JSON.
func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	default:
		return protojson.Format(v)
	}
}

type traceService struct {
	collectortrace.UnimplementedTraceServiceServer
	sink *spanSink
}

func (t traceService) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	if err := t.sink.write(req, "grpc"); err != nil {
		return nil, err
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// httpTraces is OTLP/HTTP's trace path: the request in protobuf or JSON, the answer in kind.
func httpTraces(sink *spanSink) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := &collectortrace.ExportTraceServiceRequest{}
		jsonBody := r.Header.Get("Content-Type") == "application/json"
		if jsonBody {
			err = protojson.Unmarshal(body, req)
		} else {
			err = proto.Unmarshal(body, req)
		}
		if err != nil {
			http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := sink.write(req, "http"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp := &collectortrace.ExportTraceServiceResponse{}
		var out []byte
		if jsonBody {
			w.Header().Set("Content-Type", "application/json")
			out, _ = protojson.Marshal(resp)
		} else {
			w.Header().Set("Content-Type", "application/x-protobuf")
			out, _ = proto.Marshal(resp)
		}
		_, _ = w.Write(out)
	})
}

func runOTLP(args []string) int {
	fs := flag.NewFlagSet("otlp", flag.ContinueOnError)
	grpcAddr := fs.String("grpc", "127.0.0.1:0", "OTLP/gRPC listen address")
	httpAddr := fs.String("http", "127.0.0.1:0", "OTLP/HTTP listen address")
	outPath := fs.String("out", "", "file the spans are appended to, one JSON object per line")
	if err := fs.Parse(args); err != nil || *outPath == "" {
		fmt.Fprintln(os.Stderr, "usage: controlplane otlp --grpc ADDR --http ADDR --out FILE")
		return 2
	}
	out, err := os.OpenFile(*outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sink := &spanSink{out: out}
	gl, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hl, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	server := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(server, traceService{sink: sink})
	mux := http.NewServeMux()
	mux.Handle("/v1/traces", httpTraces(sink))
	errs := make(chan error, 2)
	go func() { errs <- server.Serve(gl) }()
	go func() { errs <- http.Serve(hl, mux) }()
	fmt.Printf("grpc=%s http=%s\n", gl.Addr(), hl.Addr())
	err = <-errs
	fmt.Fprintln(os.Stderr, err)
	return 1
}
