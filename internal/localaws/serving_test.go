package localaws

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An endpoint that answers everything with an error (as fauxqs answers EventBridge and
// Kinesis) does not serve a service, and the error names the service.
func TestServesNamesTheServiceAnEndpointLacks(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"__type":"UnknownOperationException"}`, http.StatusBadRequest)
	}))
	defer srv.Close()
	err := Serves(context.Background(), srv.URL, ServiceKinesis)
	if err == nil || !strings.Contains(err.Error(), "does not serve kinesis") {
		t.Fatalf("Serves = %v, want an error naming kinesis", err)
	}
	if err := Serves(context.Background(), srv.URL, "nope"); err == nil || !strings.Contains(err.Error(), `unknown service "nope"`) {
		t.Fatalf("Serves(unknown) = %v", err)
	}
}

// moto_server serves EventBridge, Kinesis and SQS: the endpoint TestEndpointServing falls back to.
func TestMotoServesEventBridgeAndKinesis(t *testing.T) {
	t.Parallel()
	e, err := Start(context.Background(), Options{Kind: Moto})
	if err != nil {
		t.Skipf("moto_server: %v", err)
	}
	defer e.Stop()
	if err := Serves(context.Background(), e.URL, ServiceEventBridge, ServiceKinesis, ServiceSQS, ServiceSNS); err != nil {
		t.Fatal(err)
	}
}
