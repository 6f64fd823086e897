package lambdaenv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// ConsumerClaimCheck reads a consumer Lambda's claim check: nil when ClaimCheckBucket is unset
// (a message whose payload is in S3 then fails and reaches the DLQ, naming the variable).
// With it, the consumer fetches pointed-to payloads through an S3 client built from the
// function's AWS configuration (path-style for a local AWS_ENDPOINT_URL), up to
// ClaimCheckMaxPayload bytes each (defaults to inbox.DefaultMaxPayloadBytes, the relay's
// default). It fetches only from where this deployment's relay stores payloads
// (ClaimCheckBucket under ClaimCheckPrefix, owned by ClaimCheckBucketOwner): a pointer
// anywhere else fails its record (inbox.ErrPayloadLocation).
func ConsumerClaimCheck(ctx context.Context, getenv Getenv) (*inbox.ClaimCheck, error) {
	cc, err := consumerClaimCheck(getenv)
	if err != nil || cc == nil {
		return nil, err
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim check: load AWS config: %w", err)
	}
	cc.Store = inbox.NewS3PayloadStore(s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.UsePathStyle = pathStyle(awsCfg)
		// An object without a checksum (uploaded by another client, or a local emulator's) is
		// fine: the payload is checked as JSON. Do not log a line per fetch about it.
		o.DisableLogOutputChecksumValidationSkipped = true
	}))
	return cc, nil
}

// CheckConsumerClaimCheck reports what ConsumerClaimCheck would refuse, without AWS clients:
// for deployment tools.
func CheckConsumerClaimCheck(getenv Getenv) error {
	_, err := consumerClaimCheck(getenv)
	return err
}

// ClaimCheckThresholdOf reads ClaimCheckThreshold (integer bytes) as the relay's claim check
// does: 0 when unset, meaning each destination's message limit. `sluice status` reads it here.
func ClaimCheckThresholdOf(getenv Getenv) (int, error) {
	var cfg outbox.RelayConfig
	errs := readSettings(getenv, &cfg, func(s outbox.Setting) bool { return s.Field == "ClaimCheck.Threshold" })
	if len(errs) == 0 && cfg.ClaimCheck != nil {
		s := outbox.RelaySetting("ClaimCheck.Threshold")
		if err := s.Check(s.Get(cfg)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Env, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return int(outbox.RelaySetting("ClaimCheck.Threshold").Get(cfg)), nil
}

// claimCheckLocation reads where the relay stores payloads and the consumers fetch them:
// ClaimCheckBucket, ClaimCheckPrefix and ClaimCheckBucketOwner (Bucket "" when unset).
func claimCheckLocation(getenv Getenv) inbox.PayloadLocation {
	return inbox.PayloadLocation{Bucket: strings.TrimSpace(getenv(ClaimCheckBucket)), KeyPrefix: getenv(ClaimCheckPrefix),
		ExpectedBucketOwner: strings.TrimSpace(getenv(ClaimCheckBucketOwner))}
}

func consumerClaimCheck(getenv Getenv) (*inbox.ClaimCheck, error) {
	loc := claimCheckLocation(getenv)
	if loc.Bucket == "" {
		return nil, nil
	}
	maxPayload, err := positiveInt(getenv, ClaimCheckMaxPayload, 0)
	if err != nil {
		return nil, err
	}
	if maxPayload > inbox.MaxPayloadBytesLimit {
		return nil, fmt.Errorf("%s must be at most %d, got %d", ClaimCheckMaxPayload, inbox.MaxPayloadBytesLimit, maxPayload)
	}
	return &inbox.ClaimCheck{MaxPayloadBytes: maxPayload, Locations: []inbox.PayloadLocation{loc}}, nil
}
