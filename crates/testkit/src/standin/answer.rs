//! The answers, operation by operation: the requests the stand-in reads and
//! the pages, items and records it writes back.

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TableReq {
    table_name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ScanReq {
    table_name: String,
    segment: Option<u64>,
    total_segments: Option<u64>,
    limit: Option<u64>,
    exclusive_start_key: Option<Item>,
    consistent_read: Option<bool>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KeysAndAttributes {
    keys: Vec<Item>,
    consistent_read: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BatchGetReq {
    request_items: BTreeMap<String, KeysAndAttributes>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetReq {
    table_name: String,
    key: Item,
    consistent_read: Option<bool>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DescribeStreamReq {
    stream_arn: String,
    limit: Option<usize>,
    exclusive_start_shard_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ShardIteratorReq {
    stream_arn: String,
    shard_id: String,
    shard_iterator_type: String,
    sequence_number: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetRecordsReq {
    shard_iterator: String,
    limit: Option<u64>,
}

impl Shared {
    fn limiter(&self) -> Option<MutexGuard<'_, Limiter>> {
        self.limiter
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn stats_lock(&self) -> MutexGuard<'_, StandinStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn count(&self, op: &str, t: &Tally) {
        let second = self.started.elapsed().as_secs();
        let mut s = self.stats_lock();
        *s.requests
            .entry(if op.is_empty() { "?" } else { op }.to_string())
            .or_default() += 1;
        s.scanned_items += t.scanned;
        s.target_scanned_items += t.target_scanned;
        s.got_items += t.got;
        s.stream_records += t.records;
        s.written_items += t.written;
        s.write_units += t.write_units;
        s.read_units += t.read_units;
        s.throttled_requests += u64::from(t.throttled_request);
        s.throttled_items += t.throttled_items;
        s.errors_500 += u64::from(t.error_500);
        while s.windows.len() as u64 <= second {
            let n = s.windows.len() as u64;
            s.windows.push(Window {
                second: n,
                ..Window::default()
            });
        }
        let w = &mut s.windows[second as usize];
        w.written_items += t.written;
        w.write_units += t.write_units;
        w.throttled_requests += u64::from(t.throttled_request);
        w.throttled_items += t.throttled_items;
        w.served_items += t.scanned + t.target_scanned + t.got + t.records;
    }

    pub(super) fn stats_now(&self) -> StandinStats {
        let mut s = self.stats_lock().clone();
        s.uptime_seconds = self.started.elapsed().as_secs_f64();
        let (user, system, rss) = rusage();
        s.cpu_user_seconds = user;
        s.cpu_system_seconds = system;
        s.max_rss_kb = rss;
        s
    }

    pub(super) fn dispatch(&self, op: &str, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        match op {
            "DescribeTable" => self.describe_table(body),
            "ListTables" => {
                let mut names: Vec<&str> =
                    self.model.tables.iter().map(|t| t.name.as_str()).collect();
                names.sort_unstable();
                Ok(json!({ "TableNames": names }).to_string().into_bytes())
            }
            "Scan" => self.scan(body, t),
            "BatchGetItem" => self.batch_get(body, t),
            "GetItem" => self.get_item(body, t),
            "BatchWriteItem" => self.batch_write(body, t),
            "PutItem" => self.single_write(body, "Item", t),
            "DeleteItem" | "UpdateItem" => self.single_write(body, "Key", t),
            "DescribeStream" => self.describe_stream(body),
            "ListStreams" => Ok(json!({ "Streams": [{
                "StreamArn": self.model.stream_arn(),
                "StreamLabel": STREAM_LABEL,
                "TableName": self.model.source_table(),
            }]})
            .to_string()
            .into_bytes()),
            "GetShardIterator" => self.shard_iterator(body),
            "GetRecords" => self.get_records(body, t),
            _ => Err(error(
                StatusCode::BAD_REQUEST,
                "UnknownOperationException",
                "com.amazon.coral.service#UnknownOperationException",
                &format!("the stand-in does not serve `{op}`"),
            )),
        }
    }

    fn describe_table(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: TableReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        let attrs: Vec<Json> = table
            .key
            .attrs()
            .map(|a| json!({ "AttributeName": a.name, "AttributeType": a.ty.name() }))
            .collect();
        let mut schema =
            vec![json!({ "AttributeName": table.key.partition_key.name, "KeyType": "HASH" })];
        if let Some(sk) = &table.key.sort_key {
            schema.push(json!({ "AttributeName": sk.name, "KeyType": "RANGE" }));
        }
        let items = self.model.items.items();
        let limits = self.limiter().map(|l| l.limits);
        let provisioned =
            |rate: Option<f64>| rate.filter(|r| r.is_finite()).map_or(0, |r| r as u64);
        let (rcu, wcu) = match limits {
            Some(l) => (provisioned(l.table_read), provisioned(l.table_write)),
            None => (0, 0),
        };
        let billing = if rcu > 0 || wcu > 0 {
            "PROVISIONED"
        } else {
            "PAY_PER_REQUEST"
        };
        let mut t = json!({
            "AttributeDefinitions": attrs,
            "BillingModeSummary": { "BillingMode": billing },
            "CreationDateTime": CREATED,
            "ItemCount": items,
            "KeySchema": schema,
            "ProvisionedThroughput": {
                "NumberOfDecreasesToday": 0,
                "ReadCapacityUnits": rcu,
                "WriteCapacityUnits": wcu,
            },
            "TableArn": limits::table_arn(&table.name),
            "TableId": format!("00000000-0000-0000-0000-00000000000{}", table.role as u8),
            "TableName": table.name,
            "TableSizeBytes": items * self.model.items.item_bytes() as u64,
            "TableStatus": "ACTIVE",
        });
        if table.role == Role::Source {
            t["StreamSpecification"] =
                json!({ "StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES" });
            t["LatestStreamArn"] = json!(self.model.stream_arn());
            t["LatestStreamLabel"] = json!(STREAM_LABEL);
        }
        Ok(json!({ "Table": t }).to_string().into_bytes())
    }

    fn scan(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: ScanReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        if let Some(mut l) = self.limiter()
            && let Err(r) = l.scan_allowed(&table.name)
        {
            t.throttled_request = true;
            return Err(Answer::Throttle(r));
        }
        let total = req.total_segments.unwrap_or(1);
        let segment = req.segment.unwrap_or(0);
        if total == 0 || total > 1_000_000 || segment >= total {
            return Err(validation("Segment must be less than TotalSegments"));
        }
        let n = u128::from(self.model.items.items());
        let lo = (n * u128::from(segment) / u128::from(total)) as u64;
        let hi = (n * u128::from(segment + 1) / u128::from(total)) as u64;
        let start = match &req.exclusive_start_key {
            Some(k) => Generator::index_of_key(k)
                .ok_or_else(|| validation("ExclusiveStartKey names no item of this table"))?
                .saturating_add(1)
                .max(lo),
            None => lo,
        };
        let limit = req.limit.unwrap_or(u64::MAX).max(1);
        let consistent = req.consistent_read == Some(true);
        let item_bytes = self.model.items.item_bytes();
        let expected = (hi.saturating_sub(start))
            .min(limit)
            .min((MAX_PAGE_BYTES / item_bytes.max(1) + 1) as u64) as usize;
        // Item JSON is its DynamoDB size plus ~100 bytes of tags and quotes.
        let mut out = Vec::with_capacity(expected * (item_bytes + 160) + 512);
        out.extend_from_slice(br#"{"Items":["#);
        let (mut i, mut count, mut scanned, mut bytes) = (start, 0u64, 0u64, 0usize);
        let mut last: Option<u64> = None;
        let mut last_target_key: Option<Item> = None;
        while i < hi && count < limit {
            let mark = out.len();
            if count > 0 {
                out.push(b',');
            }
            let size = match table.role {
                Role::Source => {
                    let o = self.model.items.order(i);
                    let size = o.size();
                    if count > 0 && bytes + size > MAX_PAGE_BYTES {
                        out.truncate(mark);
                        break;
                    }
                    o.write_json(&mut out);
                    size
                }
                Role::Target => {
                    scanned += 1;
                    let Some(item) = self.model.target_item(i) else {
                        out.truncate(mark);
                        i += 1;
                        continue; // not in the target
                    };
                    let size = value::item_size(&item);
                    if count > 0 && bytes + size > MAX_PAGE_BYTES {
                        out.truncate(mark);
                        scanned -= 1;
                        break;
                    }
                    wire::push_item(&mut out, &item);
                    let names = table.key.names();
                    last_target_key = Some(
                        item.into_iter()
                            .filter(|(k, _)| names.contains(&k.as_str()))
                            .collect(),
                    );
                    size
                }
            };
            bytes += size;
            count += 1;
            last = Some(i);
            i += 1;
        }
        if table.role == Role::Source {
            scanned = count;
            t.scanned = count;
        } else {
            t.target_scanned = count;
        }
        out.extend_from_slice(br#"],"Count":"#);
        wire::push_u64(&mut out, count);
        out.extend_from_slice(br#","ScannedCount":"#);
        wire::push_u64(&mut out, scanned);
        if i < hi
            && let Some(last) = last
        {
            out.extend_from_slice(br#","LastEvaluatedKey":"#);
            match table.role {
                Role::Source => self.model.items.order(last).write_key(&mut out),
                Role::Target => {
                    let _ = serde_json::to_writer(&mut out, &last_target_key.unwrap_or_default());
                }
            }
        }
        let units = wire::read_units(bytes, consistent);
        t.read_units = units;
        if let Some(mut l) = self.limiter() {
            l.charge_scan(&table.name, units);
        }
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        if cap != Capacity::None {
            out.extend_from_slice(br#","ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, cap);
        }
        out.push(b'}');
        Ok(out)
    }

    fn batch_get(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: BatchGetReq = parse(body)?;
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        let mut tables = Vec::new();
        for (name, ka) in &req.request_items {
            tables.push((self.model.table(name)?, ka));
        }
        // Which keys are admitted, per table (all of them without limits).
        let mut admitted: Vec<Vec<bool>> = tables
            .iter()
            .map(|(_, ka)| vec![true; ka.keys.len()])
            .collect();
        if let Some(mut l) = self.limiter() {
            let mut first = None;
            for ((table, ka), ok) in tables.iter().zip(admitted.iter_mut()) {
                let hash = table.key.partition_key.name.as_str();
                let charges = ka.keys.iter().map(|k| {
                    Some(Charge {
                        table: table.name.clone(),
                        key: value::encode_key(k, &[hash]),
                        units: 1.0,
                    })
                });
                let (flags, refusal) = l.admit_each(Kind::Read, charges);
                *ok = flags;
                if let Some(r) = refusal {
                    first.get_or_insert(r);
                }
            }
            if let Some(r) = first {
                t.throttled_request = true;
                t.throttled_items = admitted.iter().flatten().filter(|a| !**a).count() as u64;
                if !admitted.iter().flatten().any(|a| *a) {
                    return Err(Answer::Throttle(r));
                }
            }
        }
        let keys: usize = tables.iter().map(|(_, ka)| ka.keys.len()).sum();
        let mut out = Vec::with_capacity(keys * (self.model.items.item_bytes() + 200) + 512);
        let mut capacity = Vec::new();
        out.extend_from_slice(br#"{"Responses":{"#);
        for (n, ((table, ka), ok)) in tables.iter().zip(&admitted).enumerate() {
            if n > 0 {
                out.push(b',');
            }
            wire::push_str(&mut out, &table.name);
            out.extend_from_slice(b":[");
            let consistent = ka.consistent_read == Some(true);
            let mut units = 0.0;
            let mut found = 0;
            for (key, _) in ka.keys.iter().zip(ok).filter(|(_, ok)| **ok) {
                let mark = out.len();
                if found > 0 {
                    out.push(b',');
                }
                match self.model.lookup(table, key, &mut out) {
                    Some(size) => {
                        found += 1;
                        units += wire::read_units(size, consistent);
                    }
                    None => out.truncate(mark),
                }
            }
            out.push(b']');
            t.got += found;
            t.read_units += units;
            if ok.iter().any(|a| *a) {
                capacity.push((table.name.as_str(), units));
            }
        }
        out.extend_from_slice(br#"},"UnprocessedKeys":{"#);
        let mut first = true;
        for ((table, ka), ok) in tables.iter().zip(&admitted) {
            let rest: Vec<&Item> = ka
                .keys
                .iter()
                .zip(ok)
                .filter(|(_, ok)| !**ok)
                .map(|(k, _)| k)
                .collect();
            if rest.is_empty() {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            wire::push_str(&mut out, &table.name);
            out.extend_from_slice(br#":{"Keys":"#);
            let _ = serde_json::to_writer(&mut out, &rest);
            if let Some(c) = ka.consistent_read {
                out.extend_from_slice(if c {
                    br#","ConsistentRead":true"#
                } else {
                    br#","ConsistentRead":false"#
                });
            }
            out.push(b'}');
        }
        out.push(b'}');
        push_capacities(&mut out, &capacity, cap);
        out.push(b'}');
        Ok(out)
    }

    fn get_item(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: GetReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        if let Some(mut l) = self.limiter() {
            let hash = table.key.partition_key.name.as_str();
            let charge = Charge {
                table: table.name.clone(),
                key: value::encode_key(&req.key, &[hash]),
                units: 1.0,
            };
            if let Err(r) = l.admit(Kind::Read, &[charge]) {
                t.throttled_request = true;
                t.throttled_items = 1;
                return Err(Answer::Throttle(r));
            }
        }
        let mut out = Vec::with_capacity(self.model.items.item_bytes() + 300);
        out.push(b'{');
        let mut item = Vec::new();
        let size = self.model.lookup(table, &req.key, &mut item);
        if size.is_some() {
            out.extend_from_slice(br#""Item":"#);
            out.extend_from_slice(&item);
            t.got = 1;
        }
        let units = wire::read_units(size.unwrap_or(0), req.consistent_read == Some(true));
        t.read_units = units;
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        if cap != Capacity::None {
            if size.is_some() {
                out.push(b',');
            }
            out.extend_from_slice(br#""ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, cap);
        }
        out.push(b'}');
        Ok(out)
    }

    /// The HASH key names write requests capture: only when limits need them.
    fn capture(&self) -> Vec<&str> {
        match self.limiter {
            Some(_) => self.model.hash_names.iter().map(String::as_str).collect(),
            None => Vec::new(),
        }
    }

    fn batch_write(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let capture = self.capture();
        let req = wire::parse_batch_write(body, &capture).map_err(bad_json)?;
        let mut tables = Vec::with_capacity(req.tables.len());
        for (name, entries) in &req.tables {
            tables.push((self.model.table(name)?, entries));
        }
        let units_of = |e: &wire::WriteEntry| match e.put {
            true => value::write_units(e.info.size) as f64,
            false => 1.0,
        };
        let mut admitted: Vec<Vec<bool>> =
            tables.iter().map(|(_, e)| vec![true; e.len()]).collect();
        if let Some(mut l) = self.limiter() {
            let mut first = None;
            for ((table, entries), ok) in tables.iter().zip(admitted.iter_mut()) {
                let h = self.model.hash_index(table);
                let charges = entries.iter().map(|e| {
                    Some(Charge {
                        table: table.name.clone(),
                        key: e.info.key(h).map(<[u8]>::to_vec),
                        units: units_of(e),
                    })
                });
                let (flags, refusal) = l.admit_each(Kind::Write, charges);
                *ok = flags;
                if let Some(r) = refusal {
                    first.get_or_insert(r);
                }
            }
            if let Some(r) = first {
                t.throttled_request = true;
                t.throttled_items = admitted.iter().flatten().filter(|a| !**a).count() as u64;
                if !admitted.iter().flatten().any(|a| *a) {
                    return Err(Answer::Throttle(r));
                }
            }
        }
        let mut capacity = Vec::new();
        for ((table, entries), ok) in tables.iter().zip(&admitted) {
            let (mut units, mut n) = (0.0, 0);
            for (e, _) in entries.iter().zip(ok).filter(|(_, ok)| **ok) {
                units += units_of(e);
                n += 1;
            }
            t.written += n;
            t.write_units += units;
            if n > 0 {
                capacity.push((table.name.as_str(), units));
            }
        }
        let mut out = Vec::with_capacity(256);
        out.push(b'{');
        let cap = req.capacity;
        if cap != Capacity::None {
            push_capacities(&mut out, &capacity, cap);
            out.push(b',');
        }
        out.extend_from_slice(br#""UnprocessedItems":"#);
        if t.throttled_items == 0 {
            out.extend_from_slice(b"{}");
        } else {
            // The refused entries, as they were sent (read again: rare).
            let sent: Json = serde_json::from_slice(body).map_err(bad_json)?;
            let mut rest = serde_json::Map::new();
            for ((table, _), ok) in tables.iter().zip(&admitted) {
                let list = sent["RequestItems"][&table.name]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let refused: Vec<Json> = list
                    .into_iter()
                    .zip(ok)
                    .filter(|(_, ok)| !**ok)
                    .map(|(e, _)| e)
                    .collect();
                if !refused.is_empty() {
                    rest.insert(table.name.clone(), Json::Array(refused));
                }
            }
            let _ = serde_json::to_writer(&mut out, &rest);
        }
        out.push(b'}');
        Ok(out)
    }

    fn single_write(
        &self,
        body: &[u8],
        field: &'static str,
        t: &mut Tally,
    ) -> Result<Vec<u8>, Answer> {
        let capture = self.capture();
        let req = wire::parse_single(body, field, &capture).map_err(bad_json)?;
        let table = self.model.table(&req.table)?;
        let info = req
            .item
            .ok_or_else(|| validation(&format!("the request has no `{field}`")))?;
        let units = match field {
            "Item" => value::write_units(info.size) as f64,
            _ => 1.0,
        };
        if let Some(mut l) = self.limiter() {
            let charge = Charge {
                table: table.name.clone(),
                key: info.key(self.model.hash_index(table)).map(<[u8]>::to_vec),
                units,
            };
            if let Err(r) = l.admit(Kind::Write, &[charge]) {
                t.throttled_request = true;
                t.throttled_items = 1;
                return Err(Answer::Throttle(r));
            }
        }
        t.written = 1;
        t.write_units = units;
        let mut out = Vec::with_capacity(128);
        out.push(b'{');
        if req.capacity != Capacity::None {
            out.extend_from_slice(br#""ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, req.capacity);
        }
        out.push(b'}');
        Ok(out)
    }

    fn check_stream(&self, arn: &str) -> Result<(), Answer> {
        match arn == self.model.stream_arn() {
            true => Ok(()),
            false => Err(not_found(&format!("Stream: {arn} not found"))),
        }
    }

    fn describe_stream(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: DescribeStreamReq = parse(body)?;
        self.check_stream(&req.stream_arn)?;
        let s = &self.model.stream;
        let first = match &req.exclusive_start_shard_id {
            Some(id) => s.shard_of(id).map_or(s.shards, |i| i + 1),
            None => 0,
        };
        let limit = req.limit.unwrap_or(100).clamp(1, 100) as u32;
        let end = s.shards.min(first.saturating_add(limit));
        let shards: Vec<Json> = (first..end)
            .map(|i| {
                json!({
                    "SequenceNumberRange": { "StartingSequenceNumber": s.first_sequence(i) },
                    "ShardId": StreamGen::shard_id(i),
                })
            })
            .collect();
        let key = &self.model.tables[0].key;
        let mut schema =
            vec![json!({ "AttributeName": key.partition_key.name, "KeyType": "HASH" })];
        if let Some(sk) = &key.sort_key {
            schema.push(json!({ "AttributeName": sk.name, "KeyType": "RANGE" }));
        }
        let mut d = json!({
            "CreationRequestDateTime": CREATED,
            "KeySchema": schema,
            "Shards": shards,
            "StreamArn": self.model.stream_arn(),
            "StreamLabel": STREAM_LABEL,
            "StreamStatus": "ENABLED",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
            "TableName": self.model.source_table(),
        });
        if end < s.shards {
            d["LastEvaluatedShardId"] = json!(StreamGen::shard_id(end - 1));
        }
        Ok(json!({ "StreamDescription": d }).to_string().into_bytes())
    }

    fn shard_iterator(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: ShardIteratorReq = parse(body)?;
        self.check_stream(&req.stream_arn)?;
        let s = &self.model.stream;
        let shard = s
            .shard_of(&req.shard_id)
            .ok_or_else(|| not_found(&format!("Shard: {} not found", req.shard_id)))?;
        let at_seq = |after: bool| -> Result<u64, Answer> {
            let seq = req
                .sequence_number
                .as_deref()
                .ok_or_else(|| validation("SequenceNumber is required for this iterator type"))?;
            match s.place_of(seq) {
                Some((sh, k)) if sh == shard => Ok(k + u64::from(after)),
                _ => Err(validation(&format!(
                    "Invalid SequenceNumber {seq} for shard {}",
                    req.shard_id
                ))),
            }
        };
        let k = match req.shard_iterator_type.as_str() {
            "TRIM_HORIZON" => 0,
            "LATEST" => s.shard_len(shard),
            "AT_SEQUENCE_NUMBER" => at_seq(false)?,
            "AFTER_SEQUENCE_NUMBER" => at_seq(true)?,
            other => return Err(validation(&format!("unknown ShardIteratorType {other}"))),
        };
        let k = k.min(s.shard_len(shard));
        Ok(json!({ "ShardIterator": iterator(shard, k) })
            .to_string()
            .into_bytes())
    }

    fn get_records(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: GetRecordsReq = parse(body)?;
        let s = &self.model.stream;
        let (shard, start) = parse_iterator(&req.shard_iterator)
            .filter(|(shard, _)| *shard < s.shards)
            .ok_or_else(|| validation("Invalid ShardIterator"))?;
        let limit = req
            .limit
            .unwrap_or(stream::MAX_RECORDS)
            .clamp(1, stream::MAX_RECORDS);
        let end = s.shard_len(shard);
        let expected = end.saturating_sub(start).min(limit) as usize;
        let mut out =
            Vec::with_capacity(expected * (2 * self.model.items.item_bytes() + 600) + 256);
        out.extend_from_slice(br#"{"Records":["#);
        let (mut k, mut bytes) = (start, 0usize);
        while k < end && k - start < limit {
            let r = s.record(shard, k);
            let before = out.len();
            if k > start {
                out.push(b',');
            }
            let size = s.write_record(&self.model.items, &r, &mut out);
            if k > start && bytes + size > stream::MAX_BYTES {
                out.truncate(before);
                break;
            }
            bytes += size;
            k += 1;
        }
        t.records = k - start;
        // Open shards always have a next iterator; past the end it reads nothing.
        out.extend_from_slice(br#"],"NextShardIterator":"#);
        wire::push_str(&mut out, &iterator(shard, k));
        out.push(b'}');
        Ok(out)
    }
}

fn push_capacities(out: &mut Vec<u8>, per_table: &[(&str, f64)], cap: Capacity) {
    if cap == Capacity::None {
        return;
    }
    if out.last() != Some(&b'{') && out.last() != Some(&b',') {
        out.push(b',');
    }
    out.extend_from_slice(br#""ConsumedCapacity":["#);
    for (i, (table, units)) in per_table.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        wire::push_capacity(out, table, *units, cap);
    }
    out.push(b']');
}
