//! The control table of a fleet of workers (`rekey worker --state
//! dynamodb://TABLE`): created on demand, read with consistent reads, and
//! written only with conditional writes, which are how workers agree on who
//! holds what (`state::fleet`).
//!
//! A failed condition is an answer the caller branches on ([`Cond::Refused`]),
//! not an error: it means another worker got there first. Every other failure
//! is an [`AwsError`] naming the control table, the action and the endpoint,
//! like every other call in `aws`.

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;

use crate::aws::item::{Expressions, update_item_if};
use crate::aws::{AwsError, Clients, from_sdk_item, to_sdk, to_sdk_item};
use crate::core::plan::{KeyAttr, KeySchema};
use crate::core::value::{Item, ScalarType, Value};

/// The control table's key attributes: both strings.
pub const PK: &str = "pk";
pub const SK: &str = "sk";

/// What a conditional write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    Written,
    /// The condition did not hold: nothing was written.
    Refused,
}

/// One control table.
#[derive(Debug, Clone)]
pub struct ControlTable {
    pub clients: Clients,
    pub table: String,
}

/// The key of the item `pk`/`sk`.
pub fn key(pk: &str, sk: &str) -> Item {
    let mut k = Item::new();
    k.insert(PK.into(), Value::S(pk.into()));
    k.insert(SK.into(), Value::S(sk.into()));
    k
}

impl ControlTable {
    pub fn new(clients: &Clients, table: &str) -> ControlTable {
        ControlTable {
            clients: clients.clone(),
            table: table.to_string(),
        }
    }

    /// Creates the table (on-demand billing, `pk`/`sk` strings) and waits
    /// until it is ACTIVE; a table that exists already is used as it is,
    /// once ACTIVE (another worker may have just created it).
    pub async fn ensure(&self) -> Result<(), AwsError> {
        let schema = KeySchema {
            partition_key: KeyAttr {
                name: PK.into(),
                ty: ScalarType::S,
            },
            sort_key: Some(KeyAttr {
                name: SK.into(),
                ty: ScalarType::S,
            }),
        };
        match self.clients.describe_table(&self.table).await {
            Ok(info) => {
                info.check_key(&schema, "control")?;
                return self.clients.wait_active(&self.table).await;
            }
            Err(AwsError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        match self.clients.create_table(&self.table, &schema, false).await {
            Ok(()) => Ok(()),
            Err(AwsError::Service { code, .. }) if code == "ResourceInUseException" => {
                self.clients.wait_active(&self.table).await
            }
            Err(e) => Err(e),
        }
    }

    /// The item, read consistently, or None.
    pub async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, AwsError> {
        crate::aws::item::get_item(&self.clients, &self.table, &key(pk, sk), true).await
    }

    /// Every item under `pk`, read consistently, page after page.
    pub async fn query(&self, pk: &str) -> Result<Vec<Item>, AwsError> {
        self.query_prefix(pk, "").await
    }

    /// The items under `pk` whose sort key begins with `prefix` (all of
    /// them when it is empty), read consistently, page after page.
    pub async fn query_prefix(&self, pk: &str, prefix: &str) -> Result<Vec<Item>, AwsError> {
        let mut out = Vec::new();
        let mut start = None;
        let condition = if prefix.is_empty() {
            "#pk = :pk"
        } else {
            "#pk = :pk AND begins_with(#sk, :prefix)"
        };
        loop {
            let mut req = self
                .clients
                .dynamodb
                .query()
                .table_name(&self.table)
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", to_sdk(&Value::S(pk.into())));
            if !prefix.is_empty() {
                req = req
                    .expression_attribute_names("#sk", SK)
                    .expression_attribute_values(":prefix", to_sdk(&Value::S(prefix.into())));
            }
            let page = req
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.clients.error("Query", &self.table, e))?;
            out.extend(
                page.items
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(from_sdk_item),
            );
            start = page.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                return Ok(out);
            }
        }
    }

    /// PutItem of `item` if `condition` holds (names and values through
    /// placeholders in `e`; `e.update` is ignored).
    pub async fn put_if(&self, item: &Item, e: &Expressions) -> Result<Cond, AwsError> {
        let mut req = self
            .clients
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_sdk_item(item)))
            .condition_expression(&e.condition)
            .return_consumed_capacity(ReturnConsumedCapacity::None);
        for (k, v) in &e.names {
            req = req.expression_attribute_names(k, v);
        }
        for (k, v) in &e.values {
            req = req.expression_attribute_values(k, to_sdk(v));
        }
        match req.send().await {
            Ok(_) => Ok(Cond::Written),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(Cond::Refused)
            }
            Err(err) => Err(self.clients.error("PutItem", &self.table, err)),
        }
    }

    /// UpdateItem of `pk`/`sk` if `e.condition` holds.
    pub async fn update_if(&self, pk: &str, sk: &str, e: &Expressions) -> Result<Cond, AwsError> {
        Ok(
            match update_item_if(&self.clients, &self.table, &key(pk, sk), e).await? {
                Some(_) => Cond::Written,
                None => Cond::Refused,
            },
        )
    }
}
