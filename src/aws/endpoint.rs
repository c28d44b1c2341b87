//! Which endpoint each client talks to, resolved the way users of the AWS SDK
//! set them, so that an error can name the endpoint that failed and where it
//! came from.
//!
//! The SDK reads one variable per service (`AWS_ENDPOINT_URL_DYNAMODB`,
//! `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`, `AWS_ENDPOINT_URL_S3`), then
//! `AWS_ENDPOINT_URL`. People who point DynamoDB at a local server set the
//! first and expect its streams to follow: a DynamoDB Streams client that went
//! to AWS while the table is local could only fail. So Streams falls back to
//! the DynamoDB setting when that is not an AWS host, and says so (a note the
//! command layer prints once). `--endpoint-url` is DynamoDB's, and its
//! Streams' when it is not an AWS host; never S3's, as in the aws CLI.
//!
//! Streams: `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`, `--endpoint-url` (off AWS),
//! `AWS_ENDPOINT_URL_DYNAMODB` (off AWS, with the note), `AWS_ENDPOINT_URL`,
//! AWS's. DynamoDB: `--endpoint-url`, `AWS_ENDPOINT_URL_DYNAMODB`,
//! `AWS_ENDPOINT_URL`, AWS's. S3: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`,
//! AWS's. `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true` drops the variables, as
//! the SDK does. Endpoints in the shared config files' profiles are not
//! read here: with none of the above set, the SDK's own resolution applies
//! and messages name AWS's default.
//!
//! [`resolve`] is pure: the options, the region and an environment lookup in,
//! the three endpoints and the notes out.

use std::fmt;
use std::sync::Arc;

use super::AwsOptions;

/// The AWS service a client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    DynamoDb,
    Streams,
    S3,
}

impl Service {
    /// What a missing resource of this service is called in messages.
    pub(crate) fn resource_kind(self) -> &'static str {
        match self {
            Service::DynamoDb => "table",
            Service::Streams => "stream",
            Service::S3 => "object",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::DynamoDb => "DynamoDB",
            Service::Streams => "DynamoDB Streams",
            Service::S3 => "S3",
        })
    }
}

/// Where an endpoint setting came from: what the operator changes to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--endpoint-url`.
    Flag,
    /// An environment variable.
    Env(&'static str),
    /// Nothing was set: AWS's endpoint for the region, left to the SDK.
    AwsDefault { region: String },
    /// A client a caller built itself (library use, tests).
    Client,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("--endpoint-url"),
            Source::Env(var) => write!(f, "the {var} environment variable"),
            Source::AwsDefault { region } => write!(f, "the AWS default for region {region}"),
            Source::Client => f.write_str("the client's configuration"),
        }
    }
}

/// One service's endpoint and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub service: Service,
    pub url: String,
    pub source: Source,
}

impl Endpoint {
    /// The URL to set on the client; `None` leaves AWS's own resolution
    /// (partition, FIPS, dual-stack) to the SDK.
    pub fn explicit(&self) -> Option<&str> {
        match self.source {
            Source::AwsDefault { .. } => None,
            _ => Some(&self.url),
        }
    }

    /// True unless the URL is one of AWS's hosts.
    pub fn is_local(&self) -> bool {
        !is_aws_host(&self.url)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.url, self.source)
    }
}

/// The endpoint of each client, and what the operator should be told about
/// how they were chosen. Shared: every error of a client carries its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub dynamodb: Arc<Endpoint>,
    pub streams: Arc<Endpoint>,
    pub s3: Arc<Endpoint>,
    /// Sentences for stderr, each to be printed once per command.
    pub notes: Vec<String>,
}

pub(crate) const ENDPOINT_URL: &str = "AWS_ENDPOINT_URL";
pub(crate) const DYNAMODB: &str = "AWS_ENDPOINT_URL_DYNAMODB";
pub const STREAMS: &str = "AWS_ENDPOINT_URL_DYNAMODB_STREAMS";
pub const S3: &str = "AWS_ENDPOINT_URL_S3";
/// The SDK ignores every configured endpoint when this is `true`: so must we,
/// or errors would name an endpoint the SDK does not use.
const IGNORE: &str = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS";

/// Each service's endpoint, by the SDK's precedence (see the module docs).
/// `env` looks a variable up; an empty value counts as unset.
pub fn resolve(opts: &AwsOptions, region: &str, env: impl Fn(&str) -> Option<String>) -> Endpoints {
    let ignore = env(IGNORE).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let var = |name: &'static str| {
        env(name)
            .filter(|v| !ignore && !v.trim().is_empty())
            .map(|url| (url, Source::Env(name)))
    };
    let flag = opts
        .endpoint_url
        .clone()
        .filter(|u| !u.trim().is_empty())
        .map(|url| (url, Source::Flag));
    let dynamodb_var = var(DYNAMODB);
    // A DynamoDB setting serves Streams only off AWS: on AWS, Streams has
    // hosts of its own (streams.dynamodb.…), and DynamoDB's would refuse it.
    let off_aws = |c: &Option<(String, Source)>| c.clone().filter(|(u, _)| !is_aws_host(u));
    let (local_flag, local_dynamodb) = (off_aws(&flag), off_aws(&dynamodb_var));

    let pick = |service: Service, candidates: Vec<Option<(String, Source)>>| {
        let (url, source) = candidates.into_iter().flatten().next().unwrap_or_else(|| {
            let source = Source::AwsDefault {
                region: region.to_string(),
            };
            (aws_default(service, region), source)
        });
        Arc::new(Endpoint {
            service,
            url,
            source,
        })
    };
    let dynamodb = pick(
        Service::DynamoDb,
        vec![flag, dynamodb_var, var(ENDPOINT_URL)],
    );
    let streams = pick(
        Service::Streams,
        vec![var(STREAMS), local_flag, local_dynamodb, var(ENDPOINT_URL)],
    );
    let s3 = pick(Service::S3, vec![var(S3), var(ENDPOINT_URL)]);

    let mut notes = Vec::new();
    if streams.source == Source::Env(DYNAMODB) {
        notes.push(format!(
            "DynamoDB Streams at {} (from {DYNAMODB}; set {STREAMS} to use another)",
            streams.url
        ));
    }
    Endpoints {
        dynamodb,
        streams,
        s3,
        notes,
    }
}

/// AWS's endpoint for the service in the region, for messages only (the SDK
/// resolves the real one, which may be FIPS or dual-stack).
fn aws_default(service: Service, region: &str) -> String {
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    let host = match service {
        Service::DynamoDb => "dynamodb",
        Service::Streams => "streams.dynamodb",
        Service::S3 => "s3",
    };
    format!("https://{host}.{region}.{domain}")
}

/// Whether the URL's host is AWS's (`*.amazonaws.com`, `*.amazonaws.com.cn`,
/// `*.api.aws`) rather than a local server or an emulator.
pub(crate) fn is_aws_host(url: &str) -> bool {
    let host = host_of(url).trim_end_matches('.').to_ascii_lowercase();
    ["amazonaws.com", "amazonaws.com.cn", "api.aws"]
        .iter()
        .any(|domain| {
            host.strip_suffix(domain)
                .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
        })
}

/// The host of a URL: no scheme, user, port or path (IPv6 without brackets).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = "http://127.0.0.1:8000";
    const FLAG: &str = "http://localhost:4566";
    const AWS_DDB: &str = "https://dynamodb-fips.us-east-1.amazonaws.com";

    /// One row: the flag, the environment, then the expected
    /// (DynamoDB, Streams, S3) URLs with their sources, and whether a note is made.
    struct Case {
        name: &'static str,
        flag: Option<&'static str>,
        env: &'static [(&'static str, &'static str)],
        dynamodb: (&'static str, &'static str),
        streams: (&'static str, &'static str),
        s3: (&'static str, &'static str),
        note: bool,
    }

    const DEFAULT_DDB: (&str, &str) = (
        "https://dynamodb.eu-west-1.amazonaws.com",
        "the AWS default for region eu-west-1",
    );
    const DEFAULT_STREAMS: (&str, &str) = (
        "https://streams.dynamodb.eu-west-1.amazonaws.com",
        "the AWS default for region eu-west-1",
    );
    const DEFAULT_S3: (&str, &str) = (
        "https://s3.eu-west-1.amazonaws.com",
        "the AWS default for region eu-west-1",
    );

    const FROM_DYNAMODB: &str = "the AWS_ENDPOINT_URL_DYNAMODB environment variable";
    const FROM_STREAMS: &str = "the AWS_ENDPOINT_URL_DYNAMODB_STREAMS environment variable";
    const FROM_S3: &str = "the AWS_ENDPOINT_URL_S3 environment variable";
    const FROM_ALL: &str = "the AWS_ENDPOINT_URL environment variable";

    const CASES: &[Case] = &[
        Case {
            name: "nothing set: AWS's endpoints for the region",
            flag: None,
            env: &[],
            dynamodb: DEFAULT_DDB,
            streams: DEFAULT_STREAMS,
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "only the DynamoDB variable, local: Streams follows it, with a note",
            flag: None,
            env: &[(DYNAMODB, LOCAL)],
            dynamodb: (LOCAL, FROM_DYNAMODB),
            streams: (LOCAL, FROM_DYNAMODB),
            s3: DEFAULT_S3,
            note: true,
        },
        Case {
            name: "the DynamoDB variable on an AWS host: Streams keeps AWS's",
            flag: None,
            env: &[(DYNAMODB, AWS_DDB)],
            dynamodb: (AWS_DDB, FROM_DYNAMODB),
            streams: DEFAULT_STREAMS,
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "the DynamoDB variable on AWS, AWS_ENDPOINT_URL local: Streams takes the latter",
            flag: None,
            env: &[(DYNAMODB, AWS_DDB), (ENDPOINT_URL, FLAG)],
            dynamodb: (AWS_DDB, FROM_DYNAMODB),
            streams: (FLAG, FROM_ALL),
            s3: (FLAG, FROM_ALL),
            note: false,
        },
        Case {
            name: "the Streams variable wins over the DynamoDB one: no note",
            flag: None,
            env: &[(DYNAMODB, LOCAL), (STREAMS, "http://127.0.0.1:9")],
            dynamodb: (LOCAL, FROM_DYNAMODB),
            streams: ("http://127.0.0.1:9", FROM_STREAMS),
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "the Streams variable wins over --endpoint-url",
            flag: Some(FLAG),
            env: &[(STREAMS, "http://127.0.0.1:9")],
            dynamodb: (FLAG, "--endpoint-url"),
            streams: ("http://127.0.0.1:9", FROM_STREAMS),
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "--endpoint-url is DynamoDB's and Streams', not S3's",
            flag: Some(FLAG),
            env: &[(DYNAMODB, LOCAL), (ENDPOINT_URL, "http://127.0.0.1:7")],
            dynamodb: (FLAG, "--endpoint-url"),
            streams: (FLAG, "--endpoint-url"),
            s3: ("http://127.0.0.1:7", FROM_ALL),
            note: false,
        },
        Case {
            name: "--endpoint-url on an AWS host is DynamoDB's only: Streams keeps AWS's",
            flag: Some(AWS_DDB),
            env: &[],
            dynamodb: (AWS_DDB, "--endpoint-url"),
            streams: DEFAULT_STREAMS,
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "the DynamoDB variable before AWS_ENDPOINT_URL, for both",
            flag: None,
            env: &[(DYNAMODB, LOCAL), (ENDPOINT_URL, FLAG)],
            dynamodb: (LOCAL, FROM_DYNAMODB),
            streams: (LOCAL, FROM_DYNAMODB),
            s3: (FLAG, FROM_ALL),
            note: true,
        },
        Case {
            name: "AWS_ENDPOINT_URL for everything",
            flag: None,
            env: &[(ENDPOINT_URL, LOCAL)],
            dynamodb: (LOCAL, FROM_ALL),
            streams: (LOCAL, FROM_ALL),
            s3: (LOCAL, FROM_ALL),
            note: false,
        },
        Case {
            name: "the S3 variable before AWS_ENDPOINT_URL",
            flag: None,
            env: &[(S3, "http://127.0.0.1:5000"), (ENDPOINT_URL, LOCAL)],
            dynamodb: (LOCAL, FROM_ALL),
            streams: (LOCAL, FROM_ALL),
            s3: ("http://127.0.0.1:5000", FROM_S3),
            note: false,
        },
        Case {
            name: "empty values count as unset",
            flag: Some(""),
            env: &[(DYNAMODB, ""), (STREAMS, " "), (S3, "")],
            dynamodb: DEFAULT_DDB,
            streams: DEFAULT_STREAMS,
            s3: DEFAULT_S3,
            note: false,
        },
        Case {
            name: "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS: only --endpoint-url counts",
            flag: Some(FLAG),
            env: &[
                (IGNORE, "TRUE"),
                (DYNAMODB, LOCAL),
                (STREAMS, LOCAL),
                (ENDPOINT_URL, LOCAL),
            ],
            dynamodb: (FLAG, "--endpoint-url"),
            streams: (FLAG, "--endpoint-url"),
            s3: DEFAULT_S3,
            note: false,
        },
    ];

    #[test]
    fn each_service_resolves_by_the_sdk_precedence_and_says_where_from() {
        for c in CASES {
            let opts = AwsOptions {
                endpoint_url: c.flag.map(str::to_string),
                ..Default::default()
            };
            let lookup = |k: &str| -> Option<String> {
                c.env
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            let e = resolve(&opts, "eu-west-1", lookup);
            let got = |p: &Endpoint| (p.url.clone(), p.source.to_string());
            let want = |(u, s): (&str, &str)| (u.to_string(), s.to_string());
            assert_eq!(got(&e.dynamodb), want(c.dynamodb), "{}: DynamoDB", c.name);
            assert_eq!(got(&e.streams), want(c.streams), "{}: Streams", c.name);
            assert_eq!(got(&e.s3), want(c.s3), "{}: S3", c.name);
            assert_eq!(!e.notes.is_empty(), c.note, "{}: {:?}", c.name, e.notes);
            assert!(e.notes.len() <= 1, "{}: {:?}", c.name, e.notes);
            assert_eq!(e.dynamodb.service, Service::DynamoDb);
            assert_eq!(e.streams.service, Service::Streams);
            assert_eq!(e.s3.service, Service::S3);
        }
    }

    #[test]
    fn the_note_names_the_url_the_variable_and_the_way_out() {
        let e = resolve(&AwsOptions::default(), "us-east-1", |k| {
            (k == DYNAMODB).then(|| LOCAL.to_string())
        });
        assert_eq!(
            e.notes,
            vec![
                "DynamoDB Streams at http://127.0.0.1:8000 (from AWS_ENDPOINT_URL_DYNAMODB; \
                 set AWS_ENDPOINT_URL_DYNAMODB_STREAMS to use another)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn only_aws_defaults_are_left_to_the_sdk() {
        let e = resolve(&AwsOptions::default(), "cn-north-1", |k| {
            (k == S3).then(|| "https://s3.cn-north-1.amazonaws.com.cn".to_string())
        });
        assert_eq!(e.dynamodb.explicit(), None);
        assert_eq!(
            e.dynamodb.url,
            "https://dynamodb.cn-north-1.amazonaws.com.cn"
        );
        assert_eq!(
            e.s3.explicit(),
            Some("https://s3.cn-north-1.amazonaws.com.cn")
        );
        assert!(
            !e.s3.is_local(),
            "an AWS host keeps virtual-hosted S3 addresses"
        );
    }

    #[test]
    fn aws_hosts_are_told_from_local_ones() {
        let table = [
            ("https://dynamodb.us-east-1.amazonaws.com", true),
            ("https://streams.dynamodb.eu-west-1.amazonaws.com/", true),
            ("https://dynamodb.cn-north-1.amazonaws.com.cn", true),
            ("https://dynamodb.us-east-1.api.aws", true),
            ("HTTPS://DynamoDB.US-EAST-1.AmazonAWS.com:443/path", true),
            ("https://user@s3.amazonaws.com.", true),
            ("http://127.0.0.1:8000", false),
            ("http://localhost:4566", false),
            ("http://[::1]:8000", false),
            ("http://amazonaws.com.evil.example", false),
            ("http://notamazonaws.com", false),
            ("https://my-api.aws.example.org", false),
            ("dynamodb.local:8000", false),
        ];
        for (url, aws) in table {
            assert_eq!(is_aws_host(url), aws, "{url}");
        }
    }
}
