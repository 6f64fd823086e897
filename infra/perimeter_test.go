package infra_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
)

// request is an SQS request as a queue policy sees it: who, what, and the request context.
type request struct {
	awsPrincipal string // an IAM role ARN, or ""
	service      string // a service principal, or ""
	action       string
	context      map[string]any // condition keys; values as the template writes them (intrinsics compared structurally)
}

// evaluate decides req against one resource policy document the way IAM does for a same-account
// request: an explicit Deny wins; otherwise an Allow; otherwise the identity policy decides
// ("implicit"). moto_server accepts any SendMessage whatever the queue policy says (checked:
// a queue with a Deny-everything policy took a message), so the tests evaluate the synthesized
// policies here instead. Only what the stack's policies use is implemented: Principal "*",
// {"AWS": ...}, {"Service": ...}; Action strings; ArnEquals/ArnNotEquals/StringEquals/
// StringNotEquals/Bool with IAM's rule that a negated operator on an absent key holds.
func evaluate(t *testing.T, doc map[string]any, req request) string {
	t.Helper()
	allowed := false
	for _, s := range asList(doc["Statement"]) {
		st := s.(map[string]any)
		if !principalMatches(st["Principal"], req) || !actionMatches(st["Action"], req.action) || !conditionsHold(t, st["Condition"], req.context) {
			continue
		}
		if st["Effect"] == "Deny" {
			return "deny"
		}
		allowed = true
	}
	if allowed {
		return "allow"
	}
	return "implicit"
}

func principalMatches(p any, req request) bool {
	if p == "*" {
		return true
	}
	m, ok := p.(map[string]any)
	if !ok {
		return false
	}
	for _, v := range asList(m["AWS"]) {
		if v == "*" || (req.awsPrincipal != "" && reflect.DeepEqual(v, req.awsPrincipal)) {
			return true
		}
	}
	for _, v := range asList(m["Service"]) {
		if req.service != "" && v == req.service {
			return true
		}
	}
	return false
}

func actionMatches(a any, action string) bool {
	for _, v := range asList(a) {
		s, _ := v.(string)
		if strings.EqualFold(s, action) || s == "*" || strings.EqualFold(s, strings.SplitN(action, ":", 2)[0]+":*") {
			return true
		}
	}
	return false
}

func conditionsHold(t *testing.T, c any, ctx map[string]any) bool {
	t.Helper()
	if c == nil {
		return true
	}
	for op, keys := range c.(map[string]any) {
		for key, want := range keys.(map[string]any) {
			got, present := ctx[key]
			equal := false
			for _, w := range asList(want) {
				if present && reflect.DeepEqual(w, got) {
					equal = true
				}
			}
			switch op {
			case "ArnEquals", "StringEquals", "Bool":
				if !equal {
					return false
				}
			case "ArnNotEquals", "StringNotEquals":
				if equal { // absent key: not equal, the negated operator holds
					return false
				}
			default:
				t.Fatalf("condition operator %s is not implemented by this evaluator", op)
			}
		}
	}
	return true
}

// queuePolicyOf returns the policy document of the AWS::SQS::QueuePolicy attached to the queue
// with logical id queue.
func queuePolicyOf(t *testing.T, tmpl assertions.Template, queue string) map[string]any {
	t.Helper()
	for _, r := range *tmpl.FindResources(jsii.String("AWS::SQS::QueuePolicy"), nil) {
		props := (*r)["Properties"].(map[string]any)
		for _, q := range asList(props["Queues"]) {
			if reflect.DeepEqual(q, map[string]any{"Ref": queue}) {
				return props["PolicyDocument"].(map[string]any)
			}
		}
	}
	t.Fatalf("no queue policy on %s", queue)
	return nil
}

// deadLetterQueues returns the logical ids of the consumer's DLQ (the one a queue's RedrivePolicy
// names) and of the subscription's DLQ (the one the subscription's or rule target's names).
func deadLetterQueues(t *testing.T, tmpl assertions.Template) (dlq, subDLQ string, source any) {
	t.Helper()
	target := func(arn any) string {
		return arn.(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	}
	for _, r := range *tmpl.FindResources(jsii.String("AWS::SQS::Queue"), nil) {
		if rp, ok := (*r)["Properties"].(map[string]any)["RedrivePolicy"].(map[string]any); ok {
			dlq = target(rp["deadLetterTargetArn"])
		}
	}
	for _, r := range *tmpl.FindResources(jsii.String("AWS::SNS::Subscription"), nil) {
		props := (*r)["Properties"].(map[string]any)
		if rp, ok := props["RedrivePolicy"].(map[string]any); ok {
			subDLQ, source = target(rp["deadLetterTargetArn"]), props["TopicArn"]
		}
	}
	for _, r := range *tmpl.FindResources(jsii.String("AWS::Events::Rule"), nil) {
		props := (*r)["Properties"].(map[string]any)
		for _, tg := range asList(props["Targets"]) {
			if dc, ok := tg.(map[string]any)["DeadLetterConfig"].(map[string]any); ok {
				subDLQ = target(dc["Arn"])
			}
		}
	}
	require.NotEmpty(t, dlq, "a queue names a DLQ")
	require.NotEmpty(t, subDLQ, "the subscription or the rule's target names a DLQ")
	return dlq, subDLQ, source
}

// A forged message sent straight to either DLQ is refused; what must write there still may.
func TestDeadLetterQueuesRefuseForgedMessages(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Sluice", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		ConsumerName: "orders", CABundle: caBundle(t), ConsumerProxy: true, AlarmEmail: "oncall@example.com",
		Redrivers: []string{"arn:aws:iam::123456789012:role/operator"},
	})
	tmpl := assertions.Template_FromStack(s, nil)
	dlq, subDLQ, topic := deadLetterQueues(t, tmpl)
	tls := "true" // every request over TLS, so that EnforceSSL's Deny is not what refuses it
	forger := request{awsPrincipal: "arn:aws:iam::123456789012:role/forger", action: "sqs:SendMessage",
		context: map[string]any{"aws:SecureTransport": tls, "aws:PrincipalArn": "arn:aws:iam::123456789012:role/forger"}}
	operator := request{awsPrincipal: "arn:aws:iam::123456789012:role/operator", action: "sqs:SendMessage",
		context: map[string]any{"aws:SecureTransport": tls, "aws:PrincipalArn": "arn:aws:iam::123456789012:role/operator"}}
	sns := request{service: "sns.amazonaws.com", action: "sqs:SendMessage", context: map[string]any{"aws:SecureTransport": tls, "aws:SourceArn": topic}}
	otherTopic := request{service: "sns.amazonaws.com", action: "sqs:SendMessage",
		context: map[string]any{"aws:SecureTransport": tls, "aws:SourceArn": "arn:aws:sns:eu-west-1:123456789012:other"}}

	t.Run("consumer DLQ: nobody sends (SQS moves failed messages itself)", func(t *testing.T) {
		doc := queuePolicyOf(t, tmpl, dlq)
		require.Equal(t, "deny", evaluate(t, doc, forger))
		require.Equal(t, "deny", evaluate(t, doc, operator), "not even a redriver: redrive goes the other way")
		require.Equal(t, "deny", evaluate(t, doc, sns))
	})
	t.Run("subscription DLQ: only SNS for the outbox topic", func(t *testing.T) {
		doc := queuePolicyOf(t, tmpl, subDLQ)
		require.Equal(t, "deny", evaluate(t, doc, forger))
		require.Equal(t, "deny", evaluate(t, doc, operator))
		require.Equal(t, "deny", evaluate(t, doc, otherTopic))
		require.Equal(t, "allow", evaluate(t, doc, sns))
	})
	t.Run("template: the Deny statements", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), assertions.Match_ObjectLike(&map[string]any{
			"Queues": []any{map[string]any{"Ref": dlq}},
			"PolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{"Sid": "OnlySQSRedriveFillsIt", "Effect": "Deny", "Principal": map[string]any{"AWS": "*"}, "Action": "sqs:SendMessage"}),
			})}),
		}))
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), assertions.Match_ObjectLike(&map[string]any{
			"Queues": []any{map[string]any{"Ref": subDLQ}},
			"PolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{"Sid": "OnlyTheSourceDeadLetters", "Effect": "Deny", "Action": "sqs:SendMessage",
					"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": topic}}}),
			})}),
		}))
	})
	t.Run("the RDS Proxy's name is unique to the stack", func(t *testing.T) {
		name := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::RDS::DBProxy"), &map[string]any{"DBProxyName": name})
		require.NotEqual(t, "ConsumerProxy", *name.AsString())
		require.True(t, strings.HasPrefix(*name.AsString(), "Sluice-ConsumerProxy-"), *name.AsString())
		require.LessOrEqual(t, len(*name.AsString()), 60)

		other := infra.NewSluiceStack(awscdk.NewApp(nil), "SluiceTwo", &infra.SluiceStackProps{
			RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
			ConsumerName: "orders", CABundle: caBundle(t), ConsumerProxy: true, AlarmEmail: "oncall@example.com",
		})
		name2 := assertions.NewCapture(nil)
		assertions.Template_FromStack(other, nil).HasResourceProperties(jsii.String("AWS::RDS::DBProxy"), &map[string]any{"DBProxyName": name2})
		require.NotEqual(t, *name.AsString(), *name2.AsString(), "a second stack in the same account and region deploys")
	})
}
