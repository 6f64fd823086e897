package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/migrations"
)

// PhysicalResourceID names the migrations resource. It never changes, so an Update never makes
// CloudFormation delete the "old" resource.
const PhysicalResourceID = "sluice-migrations"

// handler applies the migrations for CloudFormation events.
type handler struct {
	databaseURL string
	log         *slog.Logger
}

// Handle applies the migrations on Create and Update and ignores Delete. The returned data
// carries the schema version, readable with Fn::GetAtt.
func (h *handler) Handle(ctx context.Context, ev cfn.Event) (string, map[string]any, error) {
	h.log.InfoContext(ctx, "migrations custom resource", "request_type", ev.RequestType, "logical_id", ev.LogicalResourceID)
	switch ev.RequestType {
	case cfn.RequestDelete:
		return PhysicalResourceID, nil, nil
	case cfn.RequestCreate, cfn.RequestUpdate:
	default:
		return PhysicalResourceID, nil, fmt.Errorf("unknown CloudFormation request type %q", ev.RequestType)
	}
	conn, err := pgx.Connect(ctx, h.databaseURL)
	if err != nil {
		return PhysicalResourceID, nil, fmt.Errorf("connect to the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Up(ctx, conn); err != nil {
		return PhysicalResourceID, nil, fmt.Errorf("apply migrations: %w", err)
	}
	var version int32
	if err := conn.QueryRow(ctx, "SELECT version FROM "+migrations.VersionTable).Scan(&version); err != nil {
		h.log.WarnContext(ctx, "read schema version", "error", err)
	}
	h.log.InfoContext(ctx, "migrations applied", "version", version)
	return PhysicalResourceID, map[string]any{"Version": version}, nil
}
