package infra

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// MigrationsResourceType is the CloudFormation type of the migrations custom resource.
const MigrationsResourceType = "Custom::SluiceMigrations"

// MigrationsProps configure Migrations.
type MigrationsProps struct {
	// CodeDir is a directory holding the migrate handler's `bootstrap` (bin/migrate after
	// `make build`). Required.
	//
	// The handler is a plain CloudFormation custom-resource handler: it applies the embedded
	// migrations on Create and Update, does nothing on Delete, and itself PUTs the response to
	// the event's ResponseURL (as aws-lambda-go's cfn.LambdaWrap does).
	CodeDir string
	// Network places the handler in the database's VPC. Network.Vpc is required.
	Network Network
	// Database is how the handler reaches PostgreSQL. Database.Secret is required.
	Database Database
	// Timeout is the handler's timeout. Defaults to 5 minutes.
	Timeout time.Duration
	// ServiceTimeout is how long CloudFormation waits for the handler's response before failing
	// the deploy. Defaults to Timeout plus 5 minutes (CloudFormation's own default is one hour).
	ServiceTimeout time.Duration
	// LogRetention is the handler log group's retention. Defaults to one month.
	LogRetention awslogs.RetentionDays

	// MaxConnections is the database's max_connections. When set, synthesis fails as soon as
	// the connections the functions of this database may open (each function's maximum
	// concurrency × its pool size, an RDS Proxy's share, the migrations' one) reach
	// MaxConnections − ReservedConnections, and the error shows the arithmetic. Defaults to 0:
	// not checked (a warning says so).
	MaxConnections int
	// ReservedConnections are the connections kept free for what is not a sluice function:
	// PostgreSQL's superuser_reserved_connections (3) and RDS's
	// rds.rds_superuser_reserved_connections (2), the secret rotation functions, and an operator's
	// `sluice` and psql sessions. Defaults to 15.
	ReservedConnections int

	// MaintenanceSchedule is how often an EventBridge rule invokes the handler to maintain the
	// partitions of a partitioned outbox_event and inbox_event, as their owner (the relay and
	// consumer roles may not create or drop tables): it creates partitions ahead and, with a
	// retention below, drops the expired ones; on plain tables it only reads the catalog.
	// Between 1 minute and 24 hours, and at most the partition intervals. Defaults to
	// DefaultMaintenanceSchedule (1 hour).
	MaintenanceSchedule time.Duration
	// OutboxRetention drops the partitions of a partitioned outbox_event whose rows were all
	// published longer ago (SLUICE_OUTBOX_RETENTION). OutboxProps.OutboxRetention sets it too.
	// Defaults to 0: nothing is dropped.
	OutboxRetention time.Duration
	// OutboxPartitionInterval is how long a new outbox partition should take to fill
	// (SLUICE_OUTBOX_PARTITION_INTERVAL). Defaults to partition.DefaultInterval (24h).
	OutboxPartitionInterval time.Duration
	// InboxRetention drops the partitions of a partitioned inbox_event whose rows were all
	// processed longer ago (SLUICE_INBOX_RETENTION). A dropped message is no longer recognised
	// as a duplicate, so it must be longer than every consumer queue's and DLQ's retention
	// (NewConsumer checks). Defaults to 0: nothing is dropped.
	InboxRetention time.Duration
	// InboxPartitionInterval is the time one new inbox partition covers
	// (SLUICE_INBOX_PARTITION_INTERVAL). Defaults to partition.DefaultInterval (24h).
	InboxPartitionInterval time.Duration
}

// DefaultMaintenanceSchedule is MigrationsProps.MaintenanceSchedule's default.
const DefaultMaintenanceSchedule = time.Hour

// MigrationsConnections is what the migrations function books of the connection budget: one
// connection each for a deploy's custom resource event and a scheduled partition maintenance,
// which may overlap.
const MigrationsConnections = 2

// DefaultReservedConnections is MigrationsProps.ReservedConnections's default.
const DefaultReservedConnections = 15

// Migrations is a custom resource that applies the embedded migrations whenever the migrate
// handler's code changes (and on the first deploy). Make the relay and consumers depend on it.
type Migrations interface {
	constructs.IConstruct
	// Function is the migrate Lambda.
	Function() awslambda.IFunction
	// Resource is the custom resource.
	Resource() awscdk.CustomResource
	// ConnectionBudget is the budget of the database's server: UseConnections books
	// connections of it. With MigrationsProps.MaxConnections it panics, showing the
	// arithmetic, once the bookings reach MaxConnections − ReservedConnections.
	ConnectionBudget
	// MaintenanceSchedule is the EventBridge rule that invokes Function to maintain the tables'
	// partitions (MigrationsProps.MaintenanceSchedule).
	MaintenanceSchedule() awsevents.Rule
	// Audited lists the consumers (built with these Migrations) that the scheduled maintenance
	// also audits end to end (SLUICE_AUDIT_CONSUMERS; internal/audit): each gets an
	// AuditMissingEvents alarm in NewMonitoring.
	Audited() []string
}

type migrations struct {
	constructs.Construct
	fn     awslambda.Function
	res    awscdk.CustomResource
	rule   awsevents.Rule
	roles  []any
	budget *connectionBudget
	// schedule and the partition settings, as the maintenance runs them (OutboxProps may set
	// the outbox's later).
	schedule                        time.Duration
	outboxRetention, outboxInterval time.Duration
	inboxRetention, inboxInterval   time.Duration
	// proxies are the RDS Proxies already booked, by construct path: consumers may share one.
	proxies map[string]bool
	// audited are the consumers the scheduled maintenance audits.
	audited []string
}

func (m *migrations) Function() awslambda.IFunction       { return m.fn }
func (m *migrations) Resource() awscdk.CustomResource     { return m.res }
func (m *migrations) MaintenanceSchedule() awsevents.Rule { return m.rule }

// bookProxy books an RDS Proxy's share of max_connections (its MaxConnectionsPercent) once,
// however many consumers connect through it.
func (m *migrations) bookProxy(proxy constructs.IConstruct, percent int) {
	path := *proxy.Node().Path()
	if m.proxies[path] {
		return
	}
	m.proxies[path] = true
	if max := m.budget.max; max == 0 {
		m.UseConnections(fmt.Sprintf("RDS Proxy %s %d%% of max_connections (not set)", path, percent), 0)
	} else {
		m.UseConnections(fmt.Sprintf("RDS Proxy %s %d%% of max_connections %d", path, percent, max), max*percent/100)
	}
}

// checkOutboxPartitions reports what OutboxProps' partition settings would conflict with.
func (m *migrations) checkOutboxPartitions(retention, interval time.Duration) error {
	var errs []error
	if retention > 0 && m.outboxRetention > 0 && retention != m.outboxRetention {
		errs = append(errs, fmt.Errorf("OutboxRetention %s differs from the migrations' OutboxRetention %s: set it in one place", retention, m.outboxRetention))
	}
	if interval > 0 && m.outboxInterval > 0 && interval != m.outboxInterval {
		errs = append(errs, fmt.Errorf("OutboxPartitionInterval %s differs from the migrations' OutboxPartitionInterval %s: set it in one place", interval, m.outboxInterval))
	}
	if interval > 0 && interval < m.schedule {
		errs = append(errs, fmt.Errorf("OutboxPartitionInterval %s is shorter than the migrations' MaintenanceSchedule %s: partitions would not be created ahead in time (new rows would go to the default partition)", interval, m.schedule))
	}
	return errors.Join(errs...)
}

// maintainOutbox hands OutboxProps' partition settings to the scheduled maintenance (checked
// with checkOutboxPartitions).
// audit adds consumer to the consumers the scheduled maintenance audits (SLUICE_AUDIT_CONSUMERS):
// their AuditMissingEvents alarm reads what it emits.
func (m *migrations) audit(consumer string) {
	m.audited = append(m.audited, consumer)
	m.fn.AddEnvironment(jsii.String(lambdaenv.AuditConsumers), jsii.String(strings.Join(m.audited, ",")), nil)
}

// Audited lists the consumers the scheduled maintenance audits.
func (m *migrations) Audited() []string { return m.audited }

func (m *migrations) maintainOutbox(retention, interval time.Duration) {
	if retention > 0 {
		m.outboxRetention = retention
	}
	if interval > 0 {
		m.outboxInterval = interval
	}
	env, _ := maintenanceEnvironment(m.outboxRetention, m.outboxInterval, m.inboxRetention, m.inboxInterval) // checked
	for _, k := range sortedKeys(env) {
		m.fn.AddEnvironment(jsii.String(k), jsii.String(env[k]), nil)
	}
}

// checkInboxRetention refuses an inbox retention that is not longer than a queue's: a message
// redelivered or redriven after its inbox row was dropped would be applied twice.
func (m *migrations) checkInboxRetention(consumer string, queue, dlq time.Duration) error {
	if m.inboxRetention <= 0 {
		return nil
	}
	longest, what := queue, "queue"
	if dlq > longest {
		longest, what = dlq, "dead-letter queues"
	}
	if m.inboxRetention <= longest {
		return fmt.Errorf("the migrations' InboxRetention %s is not longer than consumer %s's %s retention %s: a message redelivered or redriven after its inbox row was dropped would be applied twice",
			m.inboxRetention, consumer, what, longest)
	}
	return nil
}

// UseConnections books connections of the database's server (ConnectionBudget).
func (m *migrations) UseConnections(what string, n int) { m.budget.UseConnections(what, n) }

// addRole adds a function's role to the custom resource's Roles property and lets the handler
// read the role's secret (to set its password) and write it (to add the database endpoint).
func (m *migrations) addRole(p DatabaseRoleProps, secret awssecretsmanager.ISecret) {
	role := map[string]any{"Name": p.Name, "Kind": p.Kind, "SecretArn": secret.SecretArn()}
	if p.Consumer != "" {
		role["Consumer"] = p.Consumer
	}
	if p.WALPublication != "" {
		role["WALPublication"] = p.WALPublication
	}
	if len(p.Grants) > 0 {
		grants := make([]any, len(p.Grants))
		for i, g := range p.Grants {
			gm := map[string]any{"Privileges": g.Privileges}
			if g.Table != "" {
				gm["Table"] = g.Table
			} else {
				gm["Schema"] = g.Schema
			}
			grants[i] = gm
		}
		role["Grants"] = grants
	}
	for _, r := range m.roles {
		if r.(map[string]any)["Name"] == p.Name {
			panic(fmt.Errorf("sluice Migrations %q: database role %s is added twice", *m.Node().Id(), p.Name))
		}
	}
	m.roles = append(m.roles, role)
	m.res.Node().DefaultChild().(awscdk.CfnResource).AddPropertyOverride(jsii.String(RolesProperty), m.roles)
	secret.GrantRead(m.fn, nil)
	secret.GrantWrite(m.fn)
}

// RolesProperty is the migrations custom resource's property listing the functions' roles.
const RolesProperty = "Roles"

func (p *MigrationsProps) withDefaults() MigrationsProps {
	out := *p
	out.MaintenanceSchedule = orDefault(out.MaintenanceSchedule, DefaultMaintenanceSchedule)
	out.ReservedConnections = orDefault(out.ReservedConnections, DefaultReservedConnections)
	out.Timeout = orDefault(out.Timeout, 5*time.Minute)
	out.ServiceTimeout = orDefault(out.ServiceTimeout, out.Timeout+5*time.Minute)
	out.LogRetention = orDefault(out.LogRetention, awslogs.RetentionDays_ONE_MONTH)
	return out
}

func (p *MigrationsProps) validate() error {
	errs := []error{checkAssetDir("CodeDir", p.CodeDir), p.Network.validate(), p.Database.validate()}
	if p.MaxConnections < 0 || p.ReservedConnections < 0 || (p.MaxConnections > 0 && p.ReservedConnections >= p.MaxConnections) {
		errs = append(errs, fmt.Errorf("MaxConnections (%d) and ReservedConnections (%d) must not be negative, and the reserve must be below MaxConnections", p.MaxConnections, p.ReservedConnections))
	}
	if p.Timeout < 10*time.Second || p.Timeout > 15*time.Minute {
		errs = append(errs, fmt.Errorf("Timeout must be between 10s and 15m, got %s", p.Timeout))
	}
	if p.ServiceTimeout <= p.Timeout || p.ServiceTimeout > time.Hour {
		errs = append(errs, fmt.Errorf("ServiceTimeout must be longer than Timeout (%s) and at most 1h, got %s", p.Timeout, p.ServiceTimeout))
	}
	if p.MaintenanceSchedule < time.Minute || p.MaintenanceSchedule > 24*time.Hour || p.MaintenanceSchedule%time.Minute != 0 {
		errs = append(errs, fmt.Errorf("MaintenanceSchedule must be whole minutes between 1m and 24h, got %s", p.MaintenanceSchedule))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"OutboxRetention", p.OutboxRetention}, {"OutboxPartitionInterval", p.OutboxPartitionInterval}, {"InboxRetention", p.InboxRetention}, {"InboxPartitionInterval", p.InboxPartitionInterval}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.name, d.v))
		}
	}
	if _, err := maintenanceEnvironment(max(p.OutboxRetention, 0), max(p.OutboxPartitionInterval, 0), max(p.InboxRetention, 0), max(p.InboxPartitionInterval, 0)); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"OutboxPartitionInterval", p.OutboxPartitionInterval}, {"InboxPartitionInterval", p.InboxPartitionInterval}} {
		if d.v > 0 && d.v < p.MaintenanceSchedule {
			errs = append(errs, fmt.Errorf("%s %s is shorter than MaintenanceSchedule %s: partitions would not be created ahead in time (new rows would go to the default partition)", d.name, d.v, p.MaintenanceSchedule))
		}
	}
	return errors.Join(errs...)
}

// NewMigrations creates the migrate Lambda and the custom resource invoking it. It panics on
// invalid props, naming every problem.
func NewMigrations(scope constructs.Construct, id string, props *MigrationsProps) Migrations {
	p := props.withDefaults()
	invalid("Migrations", id, p.validate())

	m := &migrations{budget: &connectionBudget{max: p.MaxConnections, reserved: p.ReservedConnections,
		remedy: "Lower a function's maximum concurrency or its pool size (Database.MaxConns; on a fleet's server FleetServer.RelayConnections or ConsumerFleet.MaxConns), route consumers through an RDS Proxy, or raise max_connections (MigrationsProps.MaxConnections, a larger instance)"},
		schedule:        p.MaintenanceSchedule,
		outboxRetention: p.OutboxRetention, outboxInterval: p.OutboxPartitionInterval,
		inboxRetention: p.InboxRetention, inboxInterval: p.InboxPartitionInterval, proxies: map[string]bool{}}
	env, _ := maintenanceEnvironment(p.OutboxRetention, p.OutboxPartitionInterval, p.InboxRetention, p.InboxPartitionInterval) // validated
	fnEnv := map[string]*string{}
	for _, k := range sortedKeys(env) {
		fnEnv[k] = jsii.String(env[k])
	}
	constructs.NewConstruct_Override(m, scope, &id) // m itself is the jsii construct, so it can be passed to CDK APIs
	this := m
	m.fn = newGoFunction(this, "Function", goFunctionProps{
		description:  "migrations (CloudFormation custom resource)",
		codeDir:      p.CodeDir,
		timeout:      p.Timeout,
		memoryMB:     256,
		network:      p.Network,
		database:     p.Database,
		logRetention: p.LogRetention,
		environment:  fnEnv,
		// CloudFormation's response goes to a presigned S3 URL: the S3 gateway endpoint (or NAT).
		s3: "CloudFormation's custom resource response",
	})
	// The fingerprint of the handler (which embeds the migrations) changes with any new
	// migration, so CloudFormation sends an Update exactly when there is something to apply.
	fingerprint := awscdk.FileSystem_Fingerprint(jsii.String(p.CodeDir), nil)
	m.res = awscdk.NewCustomResource(this, jsii.String("Resource"), &awscdk.CustomResourceProps{
		ServiceToken:   m.fn.FunctionArn(),
		ResourceType:   jsii.String(MigrationsResourceType),
		ServiceTimeout: seconds(p.ServiceTimeout),
		Properties:     &map[string]any{"CodeFingerprint": fingerprint},
	})
	// The handler needs the database and its ingress rule before it runs.
	if c := p.Database.Connections; c != nil {
		if ic, ok := c.(constructs.IConstruct); ok {
			m.res.Node().AddDependency(ic)
		}
		for _, sg := range *c.Connections().SecurityGroups() {
			m.res.Node().AddDependency(sg)
		}
	}
	// The scheduled partition maintenance: the handler tells a scheduled event from a
	// CloudFormation request. It starts once the migrations ran (the tables exist). A failed
	// run is retried by Lambda's asynchronous invocation; the next one comes at the next tick.
	m.rule = awsevents.NewRule(this, jsii.String("PartitionMaintenance"), &awsevents.RuleProps{
		Description: jsii.String(fmt.Sprintf("Maintains the partitions of a partitioned outbox_event and inbox_event every %s (sluice migrations function, as the owner).", p.MaintenanceSchedule)),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(p.MaintenanceSchedule.Minutes()))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(m.fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(2),
			MaxEventAge:   seconds(p.MaintenanceSchedule),
		})},
	})
	m.rule.Node().AddDependency(m.res)
	suppressLambdaFindings(m.fn)
	if p.MaxConnections == 0 {
		awscdk.Annotations_Of(m).AddWarningV2(jsii.String("sluice:connectionBudget"), jsii.String(
			"MaxConnections is not set: the database connections of the sluice functions are not checked against max_connections"), nil)
	}
	m.UseConnections(fmt.Sprintf("migrations %d (a deploy and a scheduled partition maintenance) × 1", MigrationsConnections), MigrationsConnections)
	return m
}
