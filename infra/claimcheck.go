package infra

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// Defaults of ClaimCheckProps.
const (
	// DefaultClaimCheckPrefix is ClaimCheckProps.KeyPrefix's default.
	DefaultClaimCheckPrefix = "outbox/"
	// DefaultClaimCheckReplayWindow is ClaimCheckProps.ReplayWindow's default: a week for an
	// operator to redrive a dead-lettered message (which then lives another queue retention).
	DefaultClaimCheckReplayWindow = 7 * 24 * time.Hour
)

const day = 24 * time.Hour

// ClaimCheckProps configure a ClaimCheck: the S3 bucket where the relay stores payloads too
// large for their message (outbox.ClaimCheck) and the consumers fetch them from.
type ClaimCheckProps struct {
	// BucketName is the bucket's physical name. Defaults to a generated name.
	BucketName string
	// KeyPrefix is put before each object's key, the event id (SLUICE_CLAIM_CHECK_PREFIX); the
	// relay may write under it only. Defaults to DefaultClaimCheckPrefix ("outbox/").
	KeyPrefix string
	// Threshold is the message size in bytes above which the relay stores the payload
	// (SLUICE_CLAIM_CHECK_THRESHOLD). Defaults to each destination's limit (SNS: 256 KiB).
	Threshold int
	// MaxPayloadBytes is the largest payload the relay stores and the consumers fetch
	// (SLUICE_CLAIM_CHECK_MAX_PAYLOAD on both). Defaults to 32 MiB
	// (outbox.RelaySetting("ClaimCheck.MaxPayloadBytes")). Set WriterConfig.MaxMessageBytes of the services that write to it.
	MaxPayloadBytes int
	// EncryptionKey encrypts the objects (SSE-KMS with a bucket key); the relay may generate
	// data keys, the consumers decrypt. Defaults to S3-managed encryption (SSE-S3).
	EncryptionKey awskms.IKey
	// QueueRetention and DeadLetterRetention are the longest queue and DLQ retention of the
	// consumers that read the bucket (ConsumerProps.RetentionPeriod and
	// DeadLetterRetentionPeriod, whose defaults are theirs: 4 and 14 days). A consumer whose
	// own retention outlives the objects fails synthesis.
	QueueRetention, DeadLetterRetention time.Duration
	// ReplayWindow is how long a message may still be delivered after its DLQ retention: a
	// message `sluice redrive` moves back to its queue starts a new retention there. (A replay
	// from the outbox, `sluice replay`, stores the payload again: it needs no window.) Defaults
	// to DefaultClaimCheckReplayWindow (7 days).
	ReplayWindow time.Duration
	// Readers are the IAM principal ARNs (roles or users, of this account or another) of
	// consumers not built with sluice, such as services on the AWS extended clients for Java or
	// Python, that read the payloads (docs/claimcheck.md, "Consumers written with the AWS
	// extended clients"). The bucket policy allows each s3:GetObject under KeyPrefix and
	// s3:ListBucket (so that a missing payload reads 404, not 403), its Deny on reading exempts
	// them, and with EncryptionKey the key lets them decrypt. They may not write or delete.
	// Defaults to none: only the ConsumerProps.ClaimCheck consumers read.
	Readers []string
	// Expiration is how long an object lives (the bucket's lifecycle; S3 counts whole days
	// from the object's last write, which a republish renews). Defaults to QueueRetention +
	// DeadLetterRetention + ReplayWindow in whole days, plus one day; a shorter one fails
	// synthesis, since a message could then point at an expired object.
	Expiration time.Duration
}

// ClaimCheck is the claim check's bucket: encrypted, TLS-only, private, objects expiring after
// every message that may point at them; only the relay writes (OutboxProps.ClaimCheck) and
// only the consumers read (ConsumerProps.ClaimCheck).
type ClaimCheck interface {
	constructs.IConstruct
	// Bucket is the S3 bucket.
	Bucket() awss3.IBucket
	// Expiration is the objects' lifetime, in whole days.
	Expiration() time.Duration
	// KeyPrefix is what every object key starts with.
	KeyPrefix() string
	// DeniedRequests alarms on the bucket's 4xx answers (S3 request metrics, filter
	// ClaimCheckRequests): a consumer built on an AWS extended client left at
	// cleanupS3Payload=true, whose DeleteObject the bucket policy denies, or a consumer
	// fetching objects that expired (docs/claimcheck.md). Add your alarm action to it.
	DeniedRequests() awscloudwatch.Alarm

	// attachRelay lets fn (the relay) store payloads: its environment and PutObject.
	attachRelay(fn relayHost)
	// checkConsumer reports a consumer whose queue and DLQ retention outlive the objects.
	checkConsumer(name string, retention, deadLetterRetention time.Duration) error
	// attachConsumer lets fn (a consumer) fetch payloads: its environment and GetObject.
	attachConsumer(fn awslambda.Function)
	// maxPayload is the largest payload a consumer fetches (MaxPayloadBytes or its default).
	maxPayload() int
}

// ConsumerMemoryMB is the memory a consumer Lambda needs to hold a batch of batchSize records
// whose payloads are each up to maxPayload bytes: the inbox fetches a batch's payloads before its
// transaction and holds them together, and the handler decodes each (a second copy), over a
// base of 128 MB for the runtime, the pool and the SDK clients.
func ConsumerMemoryMB(batchSize, maxPayload int) int {
	const mib = 1 << 20
	return 128 + (2*batchSize*maxPayload+mib-1)/mib
}

type claimCheck struct {
	constructs.Construct
	bucket           awss3.Bucket
	p                ClaimCheckProps
	days             int
	writers, readers principals
	denied           awscloudwatch.Alarm
}

// claimCheckRequestsFilter names the bucket's request metrics configuration.
const claimCheckRequestsFilter = "ClaimCheckRequests"

func (c *claimCheck) Bucket() awss3.IBucket     { return c.bucket }
func (c *claimCheck) Expiration() time.Duration { return time.Duration(c.days) * day }
func (c *claimCheck) KeyPrefix() string         { return c.p.KeyPrefix }

func (c *claimCheck) DeniedRequests() awscloudwatch.Alarm { return c.denied }

func (c *claimCheck) maxPayload() int {
	if c.p.MaxPayloadBytes != 0 {
		return c.p.MaxPayloadBytes
	}
	return inbox.DefaultMaxPayloadBytes
}

// principals is a list of role ARNs that grows until synthesis: the bucket policy's conditions
// read it lazily, so roles attached after the bucket was created are in them.
type principals struct{ arns []*string }

// Produce implements awscdk.IStableListProducer.
func (p *principals) Produce() *[]*string { return &p.arns }

func (p ClaimCheckProps) withDefaults() ClaimCheckProps {
	p.KeyPrefix = orDefault(p.KeyPrefix, DefaultClaimCheckPrefix)
	p.QueueRetention = orDefault(p.QueueRetention, 4*day)
	p.DeadLetterRetention = orDefault(p.DeadLetterRetention, 14*day)
	p.ReplayWindow = orDefault(p.ReplayWindow, DefaultClaimCheckReplayWindow)
	return p
}

// minimumDays is the shortest lifetime, in whole days, that outlives every message of a queue
// with these retentions: their sum rounded up, plus a day for S3's asynchronous expiry and the
// time between a payload's upload and its message's enqueue.
func minimumDays(retention, deadLetterRetention, replay time.Duration) int {
	need := retention + deadLetterRetention + replay
	return int((need+day-1)/day) + 1
}

// iamPrincipalArn matches the ARN of an IAM role or user (ClaimCheckProps.Readers).
var iamPrincipalArn = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[\w+=,.@/-]+$`)

// relayEnvironment is the relay's claim check variables, checked by the relay's own reader.
func (p ClaimCheckProps) relayEnvironment(bucket *string) (map[string]*string, error) {
	env := map[string]*string{lambdaenv.ClaimCheckBucket: bucket, lambdaenv.ClaimCheckPrefix: jsii.String(p.KeyPrefix)}
	if p.Threshold != 0 {
		env[lambdaenv.ClaimCheckThreshold] = jsii.String(strconv.Itoa(p.Threshold))
	}
	if p.MaxPayloadBytes != 0 {
		env[lambdaenv.ClaimCheckMaxPayload] = jsii.String(strconv.Itoa(p.MaxPayloadBytes))
	}
	read := map[string]string{lambdaenv.ClaimCheckBucket: "check"}
	for k, v := range env {
		if k != lambdaenv.ClaimCheckBucket {
			read[k] = *v
		}
	}
	get := func(k string) string { return read[k] }
	cc, err := lambdaenv.ClaimCheck(get, aws.Config{})
	if err == nil {
		err = cc.Check()
	}
	if err == nil {
		err = lambdaenv.CheckConsumerClaimCheck(get)
	}
	return env, err
}

func (p ClaimCheckProps) validate() error {
	var errs []error
	if _, err := p.relayEnvironment(jsii.String("check")); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"QueueRetention", p.QueueRetention}, {"DeadLetterRetention", p.DeadLetterRetention}, {"ReplayWindow", p.ReplayWindow}, {"Expiration", p.Expiration}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.name, d.v))
		}
	}
	for _, r := range p.Readers {
		if !iamPrincipalArn.MatchString(r) {
			errs = append(errs, fmt.Errorf("Readers: %q is not an IAM role or user ARN (arn:PARTITION:iam::ACCOUNT:role/NAME)", r))
		}
	}
	need := minimumDays(p.QueueRetention, p.DeadLetterRetention, p.ReplayWindow)
	if p.Expiration > 0 && int((p.Expiration+day-1)/day) < need {
		errs = append(errs, fmt.Errorf("Expiration %s is shorter than the %d days a message may point at its object: queue retention %s + DLQ retention %s + "+
			"replay window %s, rounded up to days, plus one; an object would expire while a message pointing at it can still be delivered. "+
			"Set Expiration to at least %dd (%s), or leave it unset", p.Expiration, need, p.QueueRetention, p.DeadLetterRetention, p.ReplayWindow,
			need, time.Duration(need)*day))
	}
	return errors.Join(errs...)
}

// NewClaimCheck creates the claim check's bucket. It panics on invalid props, naming every
// problem. Pass it to OutboxProps.ClaimCheck and to the ConsumerProps.ClaimCheck of every
// consumer of the relay's topics.
func NewClaimCheck(scope constructs.Construct, id string, props *ClaimCheckProps) ClaimCheck {
	p := props.withDefaults()
	invalid("ClaimCheck", id, p.validate())

	c := &claimCheck{p: p, days: minimumDays(p.QueueRetention, p.DeadLetterRetention, p.ReplayWindow)}
	if p.Expiration > 0 {
		c.days = int((p.Expiration + day - 1) / day)
	}
	constructs.NewConstruct_Override(c, scope, &id) // c itself is the jsii construct
	this := c

	bp := &awss3.BucketProps{
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:        jsii.Bool(true), // a Deny for requests without aws:SecureTransport
		MinimumTLSVersion: jsii.Number(1.2),
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		ObjectOwnership:   awss3.ObjectOwnership_BUCKET_OWNER_ENFORCED,
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id:                                  jsii.String("ExpireAfterEveryMessage"),
			Expiration:                          awscdk.Duration_Days(jsii.Number(float64(c.days))),
			AbortIncompleteMultipartUploadAfter: awscdk.Duration_Days(jsii.Number(1)),
		}},
		// Payloads of messages in flight outlive the stack, like the queues holding them.
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
		// Request metrics, for DeniedRequests.
		Metrics: &[]*awss3.BucketMetrics{{Id: jsii.String(claimCheckRequestsFilter)}},
	}
	if p.BucketName != "" {
		bp.BucketName = jsii.String(p.BucketName)
	}
	if p.EncryptionKey != nil {
		bp.Encryption, bp.EncryptionKey, bp.BucketKeyEnabled = awss3.BucketEncryption_KMS, p.EncryptionKey, jsii.Bool(true)
	}
	c.bucket = awss3.NewBucket(this, jsii.String("Bucket"), bp)
	// A denied request is never normal here: only the relay writes, only the consumers read,
	// nobody deletes. The typical cause is a Java extended-client consumer at its default
	// cleanupS3Payload=true, whose DeleteObject fails and whose message may never leave its
	// queue; it must not stay silent.
	c.denied = awscloudwatch.NewAlarm(this, jsii.String("DeniedRequests"), &awscloudwatch.AlarmProps{
		AlarmDescription: jsii.String("The claim check's bucket answered 4xx (denied or missing objects): a consumer deleting payloads " +
			"(an AWS extended client with cleanupS3Payload=true) or fetching expired ones. Runbook: docs/claimcheck.md#consumers-written-with-the-aws-extended-clients"),
		Metric: awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace: jsii.String("AWS/S3"), MetricName: jsii.String("4xxErrors"),
			DimensionsMap: &map[string]*string{"BucketName": c.bucket.BucketName(), "FilterId": jsii.String(claimCheckRequestsFilter)},
			Statistic:     jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		}),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		Threshold:          jsii.Number(1),
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	c.admitReaders()
	suppress(c.bucket, "AwsSolutions-S1",
		"The claim check's objects are copies of outbox payloads that PostgreSQL keeps; the bucket policy lets only the relay write and "+
			"only the consumers read, and CloudTrail data events audit access where required. Server access logs would need a second bucket "+
			"for no additional control.")
	return c
}

// admitReaders lets ClaimCheckProps.Readers fetch payloads through the bucket policy: GetObject
// under the prefix, ListBucket (404 for a missing payload), the read Deny's exemption, and the
// key's decrypt.
func (c *claimCheck) admitReaders() {
	if len(c.p.Readers) == 0 {
		return
	}
	var readers []awsiam.IPrincipal
	for _, r := range c.p.Readers {
		readers = append(readers, awsiam.NewArnPrincipal(jsii.String(r)))
	}
	c.bucket.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("ReadersFetchPayloads"), Principals: &readers, Actions: jsii.Strings("s3:GetObject"),
		Resources: &[]*string{c.bucket.ArnForObjects(jsii.String(c.p.KeyPrefix + "*"))},
	}))
	c.bucket.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("ReadersTellMissingPayloads"), Principals: &readers, Actions: jsii.Strings("s3:ListBucket"),
		Resources: &[]*string{c.bucket.BucketArn()},
	}))
	if k := c.p.EncryptionKey; k != nil {
		for _, r := range readers {
			k.GrantDecrypt(r)
		}
	}
	for _, r := range c.p.Readers {
		c.admitReaderArn(jsii.String(r))
	}
}

// admitReaderArn exempts one principal ARN (a string or a token) from the bucket's read Deny,
// adding the Deny with the first.
func (c *claimCheck) admitReaderArn(arn *string) {
	if len(c.readers.arns) == 0 {
		c.deny("OnlyTheConsumersRead", &c.readers, "s3:GetObject")
	}
	c.readers.arns = append(c.readers.arns, arn)
}

// deny adds a statement denying actions on the bucket's objects to every principal but allowed.
func (c *claimCheck) deny(sid string, allowed *principals, actions ...string) {
	c.bucket.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings(actions...),
		Resources:  &[]*string{c.bucket.ArnForObjects(jsii.String("*"))},
		Conditions: &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": awscdk.Lazy_List(allowed, nil)}},
	}))
}

func (c *claimCheck) attachRelay(fn relayHost) {
	env, _ := c.p.relayEnvironment(c.bucket.BucketName()) // validated in NewClaimCheck
	for _, k := range sortedKeys(env) {
		fn.AddEnvironment(jsii.String(k), env[k])
	}
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ClaimCheckStoresPayloads"),
		Actions:   jsii.Strings("s3:PutObject"),
		Resources: &[]*string{c.bucket.ArnForObjects(jsii.String(c.p.KeyPrefix + "*"))},
	}))
	if k := c.p.EncryptionKey; k != nil {
		k.Grant(fn.Grantee(), jsii.String("kms:GenerateDataKey"))
	}
	if len(c.writers.arns) == 0 {
		// Nobody else writes or deletes: a forged payload would be applied by every consumer.
		// Objects leave through the lifecycle only.
		c.deny("OnlyTheRelayWrites", &c.writers, "s3:PutObject", "s3:DeleteObject")
	}
	c.writers.arns = append(c.writers.arns, fn.RoleArn())
	suppressObjectWildcard(fn.Construct(), c.p.KeyPrefix, "The relay stores each payload under the claim check's prefix at KeyPrefix + event_id: "+
		"object keys are not known in advance, so PutObject is granted on the prefix (s3:PutObject only, no other action).")
}

func (c *claimCheck) checkConsumer(name string, retention, deadLetterRetention time.Duration) error {
	if need := minimumDays(retention, deadLetterRetention, c.p.ReplayWindow); need > c.days {
		return fmt.Errorf("ClaimCheck: consumer %s's queue retention %s + DLQ retention %s + the claim check's replay window %s need objects to live %d days, "+
			"but they expire after %d: raise the claim check's QueueRetention and DeadLetterRetention to cover this consumer (or its Expiration to %dd)",
			name, retention, deadLetterRetention, c.p.ReplayWindow, need, c.days, need)
	}
	return nil
}

func (c *claimCheck) attachConsumer(fn awslambda.Function) {
	// The consumer fetches only from the relay's bucket and prefix, owned by this account
	// (inbox.ClaimCheck.Locations): a message cannot point it elsewhere.
	fn.AddEnvironment(jsii.String(lambdaenv.ClaimCheckBucket), c.bucket.BucketName(), nil)
	fn.AddEnvironment(jsii.String(lambdaenv.ClaimCheckPrefix), jsii.String(c.p.KeyPrefix), nil)
	fn.AddEnvironment(jsii.String(lambdaenv.ClaimCheckBucketOwner), awscdk.Aws_ACCOUNT_ID(), nil)
	if c.p.MaxPayloadBytes != 0 {
		fn.AddEnvironment(jsii.String(lambdaenv.ClaimCheckMaxPayload), jsii.String(strconv.Itoa(c.p.MaxPayloadBytes)), nil)
	}
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ClaimCheckFetchesPayloads"),
		Actions:   jsii.Strings("s3:GetObject"),
		Resources: &[]*string{c.bucket.ArnForObjects(jsii.String(c.p.KeyPrefix + "*"))},
	}))
	// Without s3:ListBucket S3 answers 403, not 404, for a missing key, and an expired
	// payload would look like a permissions problem (inbox.ErrPayloadMissing never firing).
	// S3 checks ListBucket for a GetObject without the s3:prefix key, so the grant carries no
	// s3:prefix condition (one would never match there): it lists the bucket, which holds only
	// the claim check's objects, named by event id.
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ClaimCheckTellsMissingPayloads"),
		Actions:   jsii.Strings("s3:ListBucket"),
		Resources: &[]*string{c.bucket.BucketArn()},
	}))
	if k := c.p.EncryptionKey; k != nil {
		k.GrantDecrypt(fn)
	}
	c.admitReaderArn(fn.Role().RoleArn())
	suppressObjectWildcard(fn, c.p.KeyPrefix, "A consumer fetches whichever object a message points at under the claim check's prefix: "+
		"object keys are not known in advance, so GetObject is granted on the prefix (s3:GetObject only, no other action).")
}

// suppressObjectWildcard suppresses the IAM5 finding of a grant on a bucket's objects under
// prefix (cdk-nag renders it Resource::<BucketLogicalId.Arn>/prefix*).
func suppressObjectWildcard(fn constructs.IConstruct, prefix, reason string) {
	re := `/^Resource::<[A-Za-z0-9]+\.Arn>\/` + regexp.QuoteMeta(prefix) + `\*$/`
	cdknag.NagSuppressions_AddResourceSuppressions(fn, &[]*cdknag.NagPackSuppression{{
		Id: jsii.String("AwsSolutions-IAM5"), Reason: jsii.String(reason),
		AppliesTo: &[]any{cdknag.RegexAppliesTo{Regex: jsii.String(re)}},
	}}, jsii.Bool(true))
}
