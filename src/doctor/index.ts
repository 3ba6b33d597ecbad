export { runDoctor, type DoctorOptions, type DoctorTarget } from './doctor.js';
export { formatDoctorReport, formatDoctorReportJson } from './format.js';
export type { DoctorArea, DoctorCheck, DoctorReport, DoctorStatus } from './report.js';
