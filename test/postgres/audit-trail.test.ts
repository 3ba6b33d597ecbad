import { defineAuditTrailSuite } from '../suites/audit-trail.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineAuditTrailSuite(postgresFixture);
