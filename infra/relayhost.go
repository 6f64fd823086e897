package infra

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// relayHost is where the relay runs, the relay Lambda or the relay's Fargate service: what the
// destinations, the claim check and the topic give the relay (IAM, environment, network) is
// given the same way to either.
type relayHost interface {
	// Grantee receives grants (a jsii object: the function, or the task role).
	Grantee() awsiam.IGrantable
	// Connections are the relay's security groups.
	Connections() awsec2.Connections
	// AddEnvironment sets one of the relay's environment variables.
	AddEnvironment(key, value *string)
	// AddToRolePolicy adds a statement to the relay's role.
	AddToRolePolicy(statement awsiam.PolicyStatement)
	// RoleArn is the relay's role, for the Deny statements naming who may publish.
	RoleArn() *string
	// Construct is where cdk-nag findings on the relay's policies are suppressed.
	Construct() constructs.IConstruct
}

// lambdaRelay is the relay Lambda as a relayHost.
type lambdaRelay struct{ fn awslambda.Function }

func (l lambdaRelay) Grantee() awsiam.IGrantable               { return l.fn }
func (l lambdaRelay) Connections() awsec2.Connections          { return l.fn.Connections() }
func (l lambdaRelay) AddEnvironment(key, value *string)        { l.fn.AddEnvironment(key, value, nil) }
func (l lambdaRelay) AddToRolePolicy(s awsiam.PolicyStatement) { l.fn.AddToRolePolicy(s) }
func (l lambdaRelay) RoleArn() *string                         { return l.fn.Role().RoleArn() }
func (l lambdaRelay) Construct() constructs.IConstruct         { return l.fn }

// serviceRelay is the relay's Fargate service as a relayHost: its task role and container.
type serviceRelay struct {
	task      awsecs.FargateTaskDefinition
	container awsecs.ContainerDefinition
	service   awsecs.FargateService
	logs      awslogs.LogGroup // the awslogs driver's
}

func (s serviceRelay) Grantee() awsiam.IGrantable      { return s.task.TaskRole() }
func (s serviceRelay) Connections() awsec2.Connections { return s.service.Connections() }
func (s serviceRelay) AddEnvironment(key, value *string) {
	s.container.AddEnvironment(key, value)
}
func (s serviceRelay) AddToRolePolicy(st awsiam.PolicyStatement) { s.task.AddToTaskRolePolicy(st) }
func (s serviceRelay) RoleArn() *string                          { return s.task.TaskRole().RoleArn() }
func (s serviceRelay) Construct() constructs.IConstruct          { return s.task }

var (
	_ relayHost = lambdaRelay{}
	_ relayHost = serviceRelay{}
)

// onlyTheRelay is the resource-policy statement sid that denies actions on resource to every
// principal but the relay's role and publishers (further role ARNs): a Deny wins over any
// identity policy in the account. The topic, the bus and the stream each carry one.
func onlyTheRelay(sid string, relay relayHost, publishers []string, resource *string, actions ...string) awsiam.PolicyStatement {
	allowed := []any{relay.RoleArn()}
	for _, a := range publishers {
		allowed = append(allowed, a)
	}
	return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings(actions...),
		Resources:  &[]*string{resource},
		Conditions: &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": allowed}},
	})
}
