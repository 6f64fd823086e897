package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/partition"
)

// PhysicalResourceID names the migrations resource. It never changes, so an Update never makes
// CloudFormation delete the "old" resource.
const PhysicalResourceID = "sluice-migrations"

// handler applies the migrations and the functions' roles for CloudFormation events, and
// maintains the tables' partitions for scheduled events (maintain.go).
type handler struct {
	getenv  lambdaenv.Getenv
	secrets secretStore
	log     *slog.Logger
	// partitions tune the scheduled partition maintenance of each table (nil: the defaults,
	// which create partitions ahead and drop nothing).
	partitions map[*partition.Table]*partition.Options
	// audit is the scheduled outbox → inbox audit (no consumers: none runs).
	audit lambdaenv.AuditSettings
	// metrics receives the audit's EMF lines.
	metrics io.Writer
}

// Handle applies the migrations, then creates or updates the roles of the Roles property, on
// Create and Update, and ignores Delete (tables and roles outlive the stack's resource). It
// reads the database secret on every event, so a rotated secret needs no new instance. The
// returned data carries the schema version, readable with Fn::GetAtt.
func (h *handler) Handle(ctx context.Context, ev cfn.Event) (string, map[string]any, error) {
	h.log.InfoContext(ctx, "migrations custom resource", "request_type", ev.RequestType, "logical_id", ev.LogicalResourceID)
	switch ev.RequestType {
	case cfn.RequestDelete:
		return PhysicalResourceID, nil, nil
	case cfn.RequestCreate, cfn.RequestUpdate:
	default:
		return PhysicalResourceID, nil, fmt.Errorf("unknown CloudFormation request type %q", ev.RequestType)
	}
	roles, err := parseRoles(ev.ResourceProperties)
	if err != nil {
		return PhysicalResourceID, nil, err
	}
	var old []Role
	if ev.RequestType == cfn.RequestUpdate {
		// Old properties only tell what to revoke; a malformed old list revokes nothing.
		old, _ = parseRoles(ev.OldResourceProperties)
	}
	url, err := lambdaenv.DatabaseURLFrom(ctx, h.getenv, h.secrets)
	if err != nil {
		return PhysicalResourceID, nil, err
	}
	conn, err := pgx.Connect(ctx, url)
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
	cfg := conn.Config()
	if err := applyRoles(ctx, conn, h.secrets, endpoint{Host: cfg.Host, Port: cfg.Port, DBName: cfg.Database}, roles, old); err != nil {
		return PhysicalResourceID, nil, fmt.Errorf("function roles: %w", err)
	}
	if len(roles) > 0 {
		h.log.InfoContext(ctx, "function roles applied", "roles", sortedRoleNames(roles))
	}
	return PhysicalResourceID, map[string]any{"Version": version}, nil
}
