package lambdatrace_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/lambdatrace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestSetup(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tp, stop, err := lambdatrace.Setup(env(nil), &buf, "relay")
	require.NoError(t, err)
	require.Nil(t, tp, "unset: tracing off, a nil provider")
	require.NoError(t, stop(context.Background()))

	_, _, err = lambdatrace.Setup(env(map[string]string{lambdatrace.EnvTracesExporter: "otlp"}), &buf, "relay")
	require.ErrorContains(t, err, "OTEL_TRACES_EXPORTER")

	tp, stop, err = lambdatrace.Setup(env(map[string]string{lambdatrace.EnvTracesExporter: "console", lambdatrace.EnvLambdaFunctionName: "sluice-relay"}), &buf, "relay")
	require.NoError(t, err)
	_, span := tp.Tracer("t").Start(context.Background(), "hello")
	span.End()
	require.NoError(t, stop(context.Background()))
	var got struct {
		Name     string
		Resource []struct {
			Key   string
			Value struct{ Value any }
		}
	}
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &got), "one JSON line per span: %s", buf.String())
	require.Equal(t, "hello", got.Name)
	var service any
	for _, kv := range got.Resource {
		if kv.Key == "service.name" {
			service = kv.Value.Value
		}
	}
	require.Equal(t, "sluice-relay", service)
}
