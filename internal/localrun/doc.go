// Package localrun runs sluice's Lambda binaries on one machine (the real relay and the demo's
// ledger consumer, examples/ledger, built like lambdas/consumer): each `bootstrap` under the
// AWS Lambda runtime interface emulator (RIE), a scheduler that plays EventBridge for the relay,
// an event source that plays the SQS event source mapping for the consumer (long-poll, invoke
// with a batch, delete only the successes), the SNS topic / SQS queue / DLQ / raw subscription
// created through the standard AWS APIs (so it works against fauxqs, moto and LocalStack alike), a
// fault-injecting HTTP proxy to put in front of the endpoint, and a DLQ redrive helper.
//
// `make demo` (internal/cmd/demo) and the end-to-end tests (e2e/) are built on it.
package localrun
