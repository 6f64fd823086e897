// Command migrate is the CloudFormation custom-resource handler that applies sluice's embedded
// migrations (package migrations) on Create and Update, then creates the functions' own database
// roles listed in the resource's Roles property (the relay's and each consumer's, with their
// privileges and passwords from their secrets), and does nothing on Delete: the tables and roles
// outlive the stack's resource. It logs in as the owner of the tables through the RDS Secrets
// Manager secret in DATABASE_SECRET_ARN (or DATABASE_URL), read on every event, and answers
// CloudFormation by PUTting to the event's ResponseURL (aws-lambda-go's cfn.LambdaWrap).
//
// Invoked by an EventBridge scheduled event instead, it maintains the partitions of a
// partitioned outbox_event and inbox_event (creates them ahead; with SLUICE_OUTBOX_RETENTION or
// SLUICE_INBOX_RETENTION drops the expired ones; SLUICE_OUTBOX_PARTITION_INTERVAL and
// SLUICE_INBOX_PARTITION_INTERVAL size new ones), as the owner that may; plain tables are left
// alone. A failed maintenance fails the invocation, so the function's Errors metric alarms.
// Then, with SLUICE_AUDIT_CONSUMERS, it audits each consumer (internal/audit: the events created
// in the last SLUICE_AUDIT_WINDOW that the relay published and the consumer did not apply
// SLUICE_AUDIT_ALARM_AFTER after their publication) and emits AuditMissingEvents and
// AuditUnpublishedEvents per consumer as EMF lines, which the audit alarms read.
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/migrate/bootstrap ./lambdas/migrate
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/partition"
)

func main() {
	log := lambdaenv.Logger(os.Getenv, "migrate")
	h, err := wire(context.Background(), os.Getenv, log)
	if err != nil {
		log.Error("migrate cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.Start(h.Invoke)
}

// wire checks that a database is configured, reads the partition maintenance settings and
// builds the Secrets Manager client once per cold start; the secret itself is read on every
// event.
func wire(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) (*handler, error) {
	if getenv(lambdaenv.DatabaseURL) == "" && getenv(lambdaenv.DatabaseSecretARN) == "" {
		return nil, fmt.Errorf("no database configured: set %s, or %s to an RDS Secrets Manager secret", lambdaenv.DatabaseURL, lambdaenv.DatabaseSecretARN)
	}
	parts := map[*partition.Table]*partition.Options{}
	var errs []error
	for _, t := range partition.Tables() {
		o, err := lambdaenv.Partitions(getenv, t)
		parts[t] = o
		errs = append(errs, err)
	}
	audit, err := lambdaenv.Audit(getenv)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS config: %w", err)
	}
	return &handler{getenv: getenv, secrets: secretsmanager.NewFromConfig(awsCfg), log: log,
		partitions: parts, audit: audit, metrics: os.Stdout}, nil
}
