import { defineAuditTrailSuite } from '../suites/audit-trail.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineAuditTrailSuite(sqliteFixture);
