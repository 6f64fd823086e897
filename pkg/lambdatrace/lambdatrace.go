// Package lambdatrace turns on OpenTelemetry tracing in sluice's Lambdas (and in a consumer
// copied from lambdas/consumer) when the standard OpenTelemetry environment asks for it, and
// costs nothing otherwise: with OTEL_TRACES_EXPORTER unset the provider is nil, which the relay
// and the inbox take as "no tracing".
//
// It knows the "console" exporter only (each span one JSON line in the function's log), which
// needs nothing running beside the function; `make demo` uses it to draw a trace. Exporting to
// X-Ray or another OTLP backend takes an OTLP exporter and, for X-Ray, the ADOT collector layer:
// see docs/tracing.md, which shows the few lines that replace Setup then.
package lambdatrace

import (
	"context"
	"fmt"
	"io"
	"strings"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Environment variables read by Setup (OpenTelemetry's standard names).
const (
	// EnvTracesExporter chooses the exporter: unset or ExporterNone for no tracing,
	// ExporterConsole for JSON lines in the log.
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	// EnvServiceName names the service in the spans' resource. Defaults to the Lambda
	// function's name (AWS_LAMBDA_FUNCTION_NAME), else the name the program passes.
	EnvServiceName = "OTEL_SERVICE_NAME"
	// EnvLambdaFunctionName is set by Lambda to the function's name.
	EnvLambdaFunctionName = "AWS_LAMBDA_FUNCTION_NAME"
)

// The values of EnvTracesExporter that Setup accepts.
const (
	ExporterNone    = "none"
	ExporterConsole = "console"
)

// Setup returns the tracer provider the environment asks for and a function that flushes and
// stops it (call it before the process exits: lambda.WithEnableSIGTERM). With
// OTEL_TRACES_EXPORTER unset or "none" it returns a nil provider and a no-op stop. With
// "console" each span is written to w (os.Stdout in a Lambda, so CloudWatch Logs keeps it) as
// one JSON line when it ends, synchronously, so nothing waits in memory when Lambda freezes
// the environment after an invocation. The sampler follows OTEL_TRACES_SAMPLER (default:
// parent-based, always on). Any other exporter is an error naming it.
func Setup(getenv func(string) string, w io.Writer, service string) (trace.TracerProvider, func(context.Context) error, error) {
	stop := func(context.Context) error { return nil }
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter))); v {
	case "", ExporterNone:
		return nil, stop, nil
	case ExporterConsole:
	default:
		return nil, stop, fmt.Errorf("%s=%q: this function exports spans to the console only (%q or %q); see docs/tracing.md for OTLP and X-Ray",
			EnvTracesExporter, v, ExporterConsole, ExporterNone)
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
	if err != nil {
		return nil, stop, fmt.Errorf("console span exporter: %w", err)
	}
	name := getenv(EnvServiceName)
	if name == "" {
		name = getenv(EnvLambdaFunctionName)
	}
	if name == "" {
		name = service
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		res = resource.NewSchemaless(semconv.ServiceName(name))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
