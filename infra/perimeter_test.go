package infra_test

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/constructs-go/constructs/v10"
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
			case "ArnLike", "StringLike":
				like := false
				for _, w := range asList(want) {
					if present && globMatches(resolvePseudo(w), fmt.Sprint(got)) {
						like = true
					}
				}
				if !like {
					return false
				}
			case "NumericLessThan":
				var g, w float64
				if !present {
					return false
				}
				fmt.Sscan(fmt.Sprint(got), &g)
				fmt.Sscan(fmt.Sprint(want), &w)
				if g >= w {
					return false
				}
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

// resolvePseudo evaluates a template value with the test account's pseudo parameters
// (eu-west-1, 123456789012, aws): a Join of literals and Refs to them becomes the string.
func resolvePseudo(v any) string {
	pseudo := map[string]string{"AWS::Region": "eu-west-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws"}
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		if r, ok := x["Ref"].(string); ok {
			if p, ok := pseudo[r]; ok {
				return p
			}
		}
		if j, ok := x["Fn::Join"].([]any); ok {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, resolvePseudo(p))
			}
			return strings.Join(parts, j[0].(string))
		}
	}
	return fmt.Sprint(v)
}

// globMatches is IAM's *Like matching: * any run of characters, ? one.
func globMatches(pattern, s string) bool {
	re := regexp.QuoteMeta(pattern)
	re = strings.ReplaceAll(strings.ReplaceAll(re, `\*`, ".*"), `\?`, ".")
	return regexp.MustCompile("^" + re + "$").MatchString(s)
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

// egressOf lists a function's outbound rules: "CIDR:port" for an address range,
// "s3-prefix-list:port" for the S3 gateway endpoint's prefix list, "sg:ID:port" for a security
// group (inline rules and AWS::EC2::SecurityGroupEgress resources alike).
func egressOf(tmpl assertions.Template, fn map[string]any) []string {
	var out []string
	sgs := map[string]bool{}
	for _, sg := range props(fn)["VpcConfig"].(map[string]any)["SecurityGroupIds"].([]any) {
		sgs[refID(sg)] = true
		for _, e := range asList(props(resources(tmpl, "AWS::EC2::SecurityGroup")[refID(sg)])["SecurityGroupEgress"]) {
			if rule, ok := e.(map[string]any); ok && rule["CidrIp"] != "255.255.255.255/32" {
				out = append(out, fmt.Sprintf("%v:%v", rule["CidrIp"], rule["FromPort"]))
			}
		}
	}
	for _, r := range resources(tmpl, "AWS::EC2::SecurityGroupEgress") {
		p := props(r)
		if !sgs[refID(p["GroupId"])] {
			continue
		}
		switch {
		case p["DestinationPrefixListId"] != nil:
			if !strings.HasPrefix(refID(p["DestinationPrefixListId"]), "S3PrefixList") {
				panic(fmt.Sprintf("unexpected prefix list %v", p["DestinationPrefixListId"]))
			}
			out = append(out, fmt.Sprintf("s3-prefix-list:%v", p["FromPort"]))
		case p["DestinationSecurityGroupId"] != nil:
			out = append(out, fmt.Sprintf("sg:%s:%v", refID(p["DestinationSecurityGroupId"]), p["FromPort"]))
		default:
			out = append(out, fmt.Sprintf("%v:%v", p["CidrIp"], p["FromPort"]))
		}
	}
	return out
}

// endpointPolicy returns the policy document of the VPC endpoint whose service name contains
// ".service" (its ServiceName is a Join with the region).
func endpointPolicy(t *testing.T, tmpl assertions.Template, service string) map[string]any {
	t.Helper()
	for _, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
		if p := props(r); strings.Contains(fmt.Sprint(p["ServiceName"]), "."+service) {
			doc, ok := p["PolicyDocument"].(map[string]any)
			require.True(t, ok, "the %s endpoint has a policy", service)
			return doc
		}
	}
	t.Fatalf("no %s endpoint", service)
	return nil
}

// allowedResources returns what an endpoint policy allows, by action.
func allowedResources(doc map[string]any) map[string][]any {
	out := map[string][]any{}
	for _, s := range asList(doc["Statement"]) {
		st := s.(map[string]any)
		if st["Effect"] != "Allow" {
			continue
		}
		for _, a := range asList(st["Action"]) {
			out[a.(string)] = append(out[a.(string)], asList(st["Resource"])...)
		}
	}
	return out
}

// The network path is a data perimeter: each endpoint lets through only the stack's own
// resources, the functions leave the VPC only towards what they call (S3 by its prefix list,
// no 0.0.0.0/0), and only the stack's own subscriptions may subscribe to the outbox topic.
func TestNetworkPerimeter(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Perimeter", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ConsumerName: "orders", ClaimCheck: &infra.ClaimCheckProps{},
	})
	withNag(s)
	tmpl := assertions.Template_FromStack(s, nil)
	requireNoNagErrors(t, s)
	id := func(c constructs.IConstruct) string {
		return *s.GetLogicalId(c.Node().DefaultChild().(awscdk.CfnElement))
	}
	bucket, topic, queue := firstKey(resources(tmpl, "AWS::S3::Bucket")), id(s.Outbox().Topic()), id(s.Consumer().Queue())

	t.Run("S3 gateway endpoint: CloudFormation's responses and the claim check only", func(t *testing.T) {
		allowed := allowedResources(endpointPolicy(t, tmpl, "s3"))
		require.ElementsMatch(t, []string{"s3:PutObject", "s3:GetObject", "s3:ListBucket"}, keys(allowed))
		objects := map[string]any{"Fn::Join": []any{"", []any{map[string]any{"Fn::GetAtt": []any{bucket, "Arn"}}, "/*"}}}
		require.Equal(t, []any{objects}, allowed["s3:GetObject"])
		require.Equal(t, []any{map[string]any{"Fn::GetAtt": []any{bucket, "Arn"}}}, allowed["s3:ListBucket"],
			"listing the claim check's bucket: S3 answers 404 for a missing payload only to a caller that may")
		require.Len(t, allowed["s3:PutObject"], 2)
		require.Contains(t, allowed["s3:PutObject"], objects)
		responses := fmt.Sprint(allowed["s3:PutObject"])
		require.Contains(t, responses, ":s3:::cloudformation-custom-resource-response-")
		require.Contains(t, responses, "Fn::Split:[- map[Ref:AWS::Region]]", "the region without dashes, as the bucket's name spells it")
	})
	t.Run("Secrets Manager endpoint: the stack's secrets only", func(t *testing.T) {
		allowed := allowedResources(endpointPolicy(t, tmpl, "secretsmanager"))
		var secrets []any
		for sid := range resources(tmpl, "AWS::SecretsManager::Secret") {
			secrets = append(secrets, map[string]any{"Ref": sid})
		}
		require.Len(t, secrets, 3, "master, relay, consumer")
		for _, a := range []string{"secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue", "secretsmanager:DescribeSecret", "secretsmanager:UpdateSecretVersionStage"} {
			require.ElementsMatch(t, secrets, allowed[a], a)
		}
		require.Equal(t, []any{"*"}, allowed["secretsmanager:GetRandomPassword"], "rotation; the action has no resource")
		require.Len(t, allowed, 5)
	})
	t.Run("SNS endpoint: publishing to the outbox topic only", func(t *testing.T) {
		allowed := allowedResources(endpointPolicy(t, tmpl, "sns"))
		require.Equal(t, map[string][]any{"sns:Publish": {map[string]any{"Ref": topic}}}, allowed)
	})
	t.Run("egress: S3 by its prefix list, nothing to any address", func(t *testing.T) {
		fns := resources(tmpl, "AWS::Lambda::Function")
		migrate := refID(props(resources(tmpl, infra.MigrationsResourceType)[firstKey(resources(tmpl, infra.MigrationsResourceType))])["ServiceToken"])
		for name, fnID := range map[string]string{"relay": id(s.Outbox().Relay()), "consumer": id(s.Consumer().Function()), "migrations": migrate} {
			egress := egressOf(tmpl, fns[fnID])
			require.Contains(t, egress, "s3-prefix-list:443", name)
			for _, e := range egress {
				require.False(t, strings.HasPrefix(e, "0.0.0.0/0"), "%s: %s", name, e)
			}
		}
		for id, r := range resources(tmpl, "AWS::EC2::SecurityGroup") {
			for _, e := range asList(props(r)["SecurityGroupEgress"]) {
				if rule, ok := e.(map[string]any); ok {
					require.NotEqual(t, "0.0.0.0/0", rule["CidrIp"], "security group %s", id)
				}
			}
		}
		for id, r := range resources(tmpl, "AWS::EC2::SecurityGroupEgress") {
			require.NotEqual(t, "0.0.0.0/0", props(r)["CidrIp"], "egress %s", id)
		}
		prefixList := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("Custom::AWS"), map[string]any{"Create": prefixList})
		require.Contains(t, fmt.Sprint(prefixList.AsObject()), "describeManagedPrefixLists")
	})
	t.Run("topic policy: only the stack's own subscriptions subscribe", func(t *testing.T) {
		var doc map[string]any
		for _, r := range resources(tmpl, "AWS::SNS::TopicPolicy") {
			if reflect.DeepEqual(asList(props(r)["Topics"]), []any{map[string]any{"Ref": topic}}) {
				doc = props(r)["PolicyDocument"].(map[string]any)
			}
		}
		require.NotNil(t, doc)
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::TopicPolicy"), assertions.Match_ObjectLike(&map[string]any{
			"PolicyDocument": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{"Sid": "OnlyTheStacksSubscriptions", "Effect": "Deny", "Action": "sns:Subscribe",
					"Condition": map[string]any{"StringNotEquals": map[string]any{"sns:Endpoint": []any{map[string]any{"Fn::GetAtt": []any{queue, "Arn"}}}}}}),
			})}),
		}))
		admin := "arn:aws:iam::123456789012:role/admin"
		subscribe := func(endpoint any) request {
			return request{awsPrincipal: admin, action: "sns:Subscribe",
				context: map[string]any{"aws:SecureTransport": "true", "aws:PrincipalArn": admin, "sns:Endpoint": endpoint}}
		}
		require.Equal(t, "deny", evaluate(t, doc, subscribe("arn:aws:sqs:eu-west-1:123456789012:copy")), "another queue")
		require.Equal(t, "deny", evaluate(t, doc, subscribe("https://attacker.example/hook")), "an HTTPS endpoint")
		require.Equal(t, "implicit", evaluate(t, doc, subscribe(map[string]any{"Fn::GetAtt": []any{queue, "Arn"}})), "the stack's consumer queue: IAM decides")
	})
}

// A Kinesis stream the stack creates refuses records from anyone but the relay (and the
// Publishers); MSK has no such policy (docs/deploy.md says why) and is guarded by IAM access
// control and the brokers' security group.
func TestStreamWritersPerimeter(t *testing.T) {
	s, tmpl := destinationStack(t, infra.DestinationKinesis)
	_, relayRole := relayOf(t, s, tmpl)
	stream := firstKey(resources(tmpl, "AWS::Kinesis::Stream"))
	policy := assertions.NewCapture(nil)
	tmpl.HasResourceProperties(jsii.String("AWS::Kinesis::ResourcePolicy"), map[string]any{
		"ResourceArn": map[string]any{"Fn::GetAtt": []any{stream, "Arn"}}, "ResourcePolicy": policy,
	})
	doc := *policy.AsObject()
	tmpl.HasResourceProperties(jsii.String("AWS::Kinesis::ResourcePolicy"), assertions.Match_ObjectLike(&map[string]any{
		"ResourcePolicy": assertions.Match_ObjectLike(&map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
			assertions.Match_ObjectLike(&map[string]any{"Sid": "OnlyTheRelayPutsRecords", "Effect": "Deny",
				"Action": []any{"kinesis:PutRecord", "kinesis:PutRecords"}}),
		})}),
	}))
	relay := map[string]any{"Fn::GetAtt": []any{relayRole, "Arn"}}
	forger := "arn:aws:iam::111111111111:role/forger"
	for _, action := range []string{"kinesis:PutRecord", "kinesis:PutRecords"} {
		require.Equal(t, "deny", evaluate(t, doc, request{awsPrincipal: forger, action: action, context: map[string]any{"aws:PrincipalArn": forger}}), action)
		require.Equal(t, "implicit", evaluate(t, doc, request{awsPrincipal: "relay", action: action, context: map[string]any{"aws:PrincipalArn": relay}}), action)
	}
	require.Equal(t, "implicit", evaluate(t, doc, request{awsPrincipal: forger, action: "kinesis:GetRecords", context: map[string]any{"aws:PrincipalArn": forger}}),
		"reading stays with IAM (the consumer's mapping)")

	_, msk := destinationStack(t, infra.DestinationMSK)
	msk.ResourceCountIs(jsii.String("AWS::MSK::ClusterPolicy"), jsii.Number(0))
	for id, r := range resources(msk, "AWS::EC2::SecurityGroup") {
		for _, e := range asList(props(r)["SecurityGroupEgress"]) {
			if rule, ok := e.(map[string]any); ok {
				require.NotEqual(t, "0.0.0.0/0", rule["CidrIp"], "security group %s: the pollers reach Lambda and STS through the endpoints", id)
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// No queue of the account may name a stack's queue as its dead-letter queue (SQS's move of a
// failed message is no SendMessage: the queues' Deny would not stop a forged one, and `sluice
// redrive` would hand it to the consumer). In every variant, every queue's RedriveAllowPolicy
// is denyAll, except each consumer DLQ's: byQueue, naming only the queue whose RedrivePolicy
// names it (set by a custom resource: the queue names the DLQ, so the DLQ cannot name it in
// the template), which may set that attribute on that DLQ only.
func TestDeadLetterQueuesAdmitOnlyTheirSourceQueue(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			tmpl := v.tmpl
			queues := resources(tmpl, "AWS::SQS::Queue")
			sourceOf := map[string]string{} // DLQ -> the queue naming it
			for id, q := range queues {
				if rp, ok := props(q)["RedrivePolicy"].(map[string]any); ok {
					sourceOf[refID(rp["deadLetterTargetArn"])] = id
				}
			}
			setters := map[string]map[string]any{} // DLQ -> the custom resource setting its policy
			for _, r := range resources(tmpl, infra.RedriveSourceResourceType) {
				create := props(r)["Create"]
				require.Contains(t, fmt.Sprint(create), `setQueueAttributes`)
				require.Contains(t, fmt.Sprint(create), `\"redrivePermission\":\"byQueue\"`)
				refs := slices.Compact(slices.Sorted(slices.Values(refsIn(create))))
				require.Len(t, refs, 2, "the DLQ (its URL, and its ARN as the physical id) and the source queue's ARN: %v", create)
				dlq, src := refs[0], refs[1]
				if _, ok := sourceOf[dlq]; !ok {
					dlq, src = src, dlq
				}
				setters[dlq] = r
				require.Equal(t, sourceOf[dlq], src, "DLQ %s admits exactly the queue that names it", dlq)
			}
			require.NotEmpty(t, queues)
			for id, q := range queues {
				if src, isDLQ := sourceOf[id]; isDLQ {
					require.Contains(t, setters, id, "consumer DLQ %s (of %s) gets a byQueue RedriveAllowPolicy", id, src)
					require.NotContains(t, props(q), "RedriveAllowPolicy", "the custom resource owns it")
					continue
				}
				require.Equal(t, map[string]any{"redrivePermission": "denyAll"}, props(q)["RedriveAllowPolicy"],
					"queue %s is no queue's DLQ: none may name it", id)
			}
			// Each setter may set attributes on its DLQ only.
			for _, pol := range resources(tmpl, "AWS::IAM::Policy") {
				for _, s := range asList(props(pol)["PolicyDocument"].(map[string]any)["Statement"]) {
					st := s.(map[string]any)
					if st["Action"] == "sqs:SetQueueAttributes" {
						require.Contains(t, setters, refID(st["Resource"]), "SetQueueAttributes only on a consumer DLQ: %v", st)
					}
				}
			}
		})
	}
}

// The alarm topic takes notifications from CloudWatch alone, for this account's alarms: anyone
// else in the account (whatever their identity policy) is refused, so nobody sends a false
// alarm or an OK that hides a real one. Every variant.
func TestAlarmTopicTakesOnlyCloudWatch(t *testing.T) {
	account := map[string]any{"Ref": "AWS::AccountId"}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			alarmTopic := firstKeyWithPrefix(resources(v.tmpl, "AWS::SNS::Topic"), "MonitoringAlarmTopic")
			require.NotEmpty(t, alarmTopic)
			var doc map[string]any
			for _, r := range resources(v.tmpl, "AWS::SNS::TopicPolicy") {
				if reflect.DeepEqual(asList(props(r)["Topics"]), []any{map[string]any{"Ref": alarmTopic}}) {
					doc = props(r)["PolicyDocument"].(map[string]any)
				}
			}
			require.NotNil(t, doc, "the alarm topic has a policy")
			publish := func(principal, service string, ctx map[string]any) string {
				ctx["aws:SecureTransport"] = "true"
				if service != "" {
					ctx["aws:PrincipalServiceName"] = service
				} else {
					ctx["aws:PrincipalArn"] = principal
				}
				return evaluate(t, doc, request{awsPrincipal: principal, service: service, action: "sns:Publish", context: ctx})
			}
			alarm := "arn:aws:cloudwatch:eu-west-1:123456789012:alarm:Sluice-RelayHeartbeat"
			require.Equal(t, "allow", publish("", "cloudwatch.amazonaws.com", map[string]any{"aws:SourceAccount": account, "aws:SourceArn": alarm}))
			require.Equal(t, "implicit", publish("", "cloudwatch.amazonaws.com",
				map[string]any{"aws:SourceAccount": "999999999999", "aws:SourceArn": "arn:aws:cloudwatch:eu-west-1:999999999999:alarm:x"}),
				"another account's alarms: not allowed")
			require.Equal(t, "deny", publish("arn:aws:iam::123456789012:role/admin", "", map[string]any{}), "a role of the account")
			require.Equal(t, "deny", publish("", "events.amazonaws.com", map[string]any{"aws:SourceAccount": account}), "another service")
		})
	}
}
