package snsbroker

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sns"
)

// ClientOptions selects how NewClient configures the SNS client. Everything
// left zero comes from the standard aws-sdk-go-v2 configuration: the
// AWS_REGION / AWS_PROFILE / AWS_ENDPOINT_URL_SNS environment, the shared
// config and credentials files, and the default credentials chain
// (environment, web identity, ECS, EC2 instance role).
type ClientOptions struct {
	// Region overrides the configured region, e.g. "eu-west-1".
	Region string
	// Endpoint overrides the SNS endpoint (the client's BaseEndpoint), e.g.
	// an emulator at "http://127.0.0.1:24100".
	Endpoint string
	// Credentials overrides the default credentials chain.
	Credentials aws.CredentialsProvider
	// LoadOptions are passed to config.LoadDefaultConfig after the above.
	LoadOptions []func(*config.LoadOptions) error
}

// NewClient loads the standard AWS configuration with o applied and returns
// an SNS client for New.
func NewClient(ctx context.Context, o ClientOptions) (*sns.Client, error) {
	var load []func(*config.LoadOptions) error
	if o.Region != "" {
		load = append(load, config.WithRegion(o.Region))
	}
	if o.Credentials != nil {
		load = append(load, config.WithCredentialsProvider(o.Credentials))
	}
	load = append(load, o.LoadOptions...)
	cfg, err := config.LoadDefaultConfig(ctx, load...)
	if err != nil {
		return nil, fmt.Errorf("snsbroker: load AWS config: %w", err)
	}
	return sns.NewFromConfig(cfg, func(so *sns.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
	}), nil
}
