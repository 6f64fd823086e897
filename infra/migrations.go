package infra

import (
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
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
}

// Migrations is a custom resource that applies the embedded migrations whenever the migrate
// handler's code changes (and on the first deploy). Make the relay and consumers depend on it.
type Migrations interface {
	constructs.IConstruct
	// Function is the migrate Lambda.
	Function() awslambda.IFunction
	// Resource is the custom resource.
	Resource() awscdk.CustomResource
}

type migrations struct {
	constructs.Construct
	fn  awslambda.Function
	res awscdk.CustomResource
}

func (m *migrations) Function() awslambda.IFunction   { return m.fn }
func (m *migrations) Resource() awscdk.CustomResource { return m.res }

func (p *MigrationsProps) withDefaults() MigrationsProps {
	out := *p
	out.Timeout = orDefault(out.Timeout, 5*time.Minute)
	out.ServiceTimeout = orDefault(out.ServiceTimeout, out.Timeout+5*time.Minute)
	out.LogRetention = orDefault(out.LogRetention, awslogs.RetentionDays_ONE_MONTH)
	return out
}

func (p *MigrationsProps) validate() error {
	errs := []error{checkAssetDir("CodeDir", p.CodeDir), p.Network.validate(), p.Database.validate()}
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

	m := &migrations{}
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
	return m
}
