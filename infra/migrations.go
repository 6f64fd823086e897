package infra

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
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
}

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
	// UseConnections books connections of the database for what (e.g. "relay: 6 × 4"); the
	// constructs book their functions themselves. With MigrationsProps.MaxConnections it panics,
	// showing the arithmetic, once the bookings reach MaxConnections − ReservedConnections.
	UseConnections(what string, connections int)
}

type migrations struct {
	constructs.Construct
	fn       awslambda.Function
	res      awscdk.CustomResource
	roles    []any
	bookings []booking
	max      int
	reserved int
}

type booking struct {
	what string
	n    int
}

func (m *migrations) Function() awslambda.IFunction   { return m.fn }
func (m *migrations) Resource() awscdk.CustomResource { return m.res }

func (m *migrations) UseConnections(what string, n int) {
	m.bookings = append(m.bookings, booking{what, n})
	if m.max == 0 {
		return
	}
	total := 0
	terms := make([]string, len(m.bookings))
	for i, b := range m.bookings {
		total += b.n
		terms[i] = fmt.Sprintf("%s = %d", b.what, b.n)
	}
	if budget := m.max - m.reserved; total >= budget {
		panic(fmt.Errorf("sluice: the functions may open more database connections than the server allows:\n  %s\n  total %d, but max_connections %d − %d reserved = %d must stay above it.\n"+
			"Lower a function's maximum concurrency or its pool size (Database.MaxConns), route consumers through an RDS Proxy, or raise max_connections (MigrationsProps.MaxConnections, a larger instance)",
			strings.Join(terms, "\n  + "), total, m.max, m.reserved, budget))
	}
}

// addRole adds a function's role to the custom resource's Roles property and lets the handler
// read the role's secret (to set its password) and write it (to add the database endpoint).
func (m *migrations) addRole(p DatabaseRoleProps, secret awssecretsmanager.ISecret) {
	role := map[string]any{"Name": p.Name, "Kind": p.Kind, "SecretArn": secret.SecretArn()}
	if p.Consumer != "" {
		role["Consumer"] = p.Consumer
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
	return errors.Join(errs...)
}

// NewMigrations creates the migrate Lambda and the custom resource invoking it. It panics on
// invalid props, naming every problem.
func NewMigrations(scope constructs.Construct, id string, props *MigrationsProps) Migrations {
	p := props.withDefaults()
	invalid("Migrations", id, p.validate())

	m := &migrations{max: p.MaxConnections, reserved: p.ReservedConnections}
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
		// CloudFormation's response goes to a presigned S3 URL: the S3 gateway endpoint (or NAT).
		httpsAnywhere: true,
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
	suppressLambdaFindings(m.fn)
	if p.MaxConnections == 0 {
		awscdk.Annotations_Of(m).AddWarningV2(jsii.String("sluice:connectionBudget"), jsii.String(
			"MaxConnections is not set: the database connections of the sluice functions are not checked against max_connections"), nil)
	}
	m.UseConnections("migrations 1 × 1", 1)
	return m
}
