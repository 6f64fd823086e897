// Command migrate is the CloudFormation custom-resource handler that applies sluice's embedded
// migrations (package migrations) on Create and Update, and does nothing on Delete: the tables
// outlive the stack's resource. It reaches PostgreSQL through the RDS Secrets Manager secret in
// DATABASE_SECRET_ARN (or DATABASE_URL), read once per cold start, and answers CloudFormation by
// PUTting to the event's ResponseURL (aws-lambda-go's cfn.LambdaWrap).
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/migrate/bootstrap ./lambdas/migrate
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/sluicehq/sluice/internal/lambdaenv"
)

func main() {
	log := lambdaenv.Logger(os.Getenv, "migrate")
	h, err := wire(context.Background(), os.Getenv, log)
	if err != nil {
		log.Error("migrate cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.Start(cfn.LambdaWrap(h.Handle))
}

// wire reads the database URL once per cold start.
func wire(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) (*handler, error) {
	url, err := lambdaenv.ResolveDatabaseURL(ctx, getenv)
	if err != nil {
		return nil, err
	}
	return &handler{databaseURL: url, log: log}, nil
}
