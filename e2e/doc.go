// Package e2e holds sluice's end-to-end tests: the real relay and consumer binaries under the
// Lambda runtime interface emulator, real PostgreSQL and an SNS/SQS endpoint (fauxqs, or
// LocalStack via AWS_ENDPOINT_URL), on the happy path and under faults. Each test ends by
// checking that every committed event was applied exactly once.
package e2e
